//go:build linux

package datapath

import (
	"testing"
	"time"

	"github.com/lbd-dev/lbd/bpf/lbxdp"
)

// BenchmarkGC2M sweeps a conntrack table of 1M expired and 1M live entries (the
// entries are reloaded before each pass). Reported per pass; the baseline in the same
// run is BenchmarkGCScanOnly2M, the same table read without deleting.
func BenchmarkGC2M(b *testing.B) { benchGC(b, true) }

// BenchmarkGCScanOnly2M runs the same pass over the same table with nothing expired.
func BenchmarkGCScanOnly2M(b *testing.B) { benchGC(b, false) }

func benchGC(b *testing.B, sweep bool) {
	n := newNode(b)
	m := n.open(b, n.config(1<<22))
	expired := ctEntries(1<<20, 0, 1, 10, -time.Minute, 3)
	live := ctEntries(1<<20, 0, 1, 10, time.Hour, 4)
	for i := range live {
		live[i].Flow.Src = netip4(100, byte(64+i>>16), byte(i>>8), byte(i), live[i].Flow.Src.Port())
	}
	if _, err := m.lb.RestoreConntrack(live); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		b.StopTimer()
		if _, err := m.lb.RestoreConntrack(expired); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if sweep {
			if sw, err := (conntrackTable{m.lb}).Sweep(lbxdp.MonotonicNow()); err != nil || sw.Deleted != 1<<20 {
				b.Fatalf("deleted %d: %v", sw.Deleted, err)
			}
		} else if sw, err := m.lb.SweepConntrack(0); err != nil || sw.Deleted != 0 {
			// Time zero: nothing has expired, so this is the same pass without deletes.
			b.Fatalf("deleted %d: %v", sw.Deleted, err)
		}
	}
}
