//go:build linux

package datapath

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/bpf/lbxdp"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// BenchmarkReconcile10k loads 10,000 services × 10 backends (100,000 backends, Maglev
// tables of 16381 slots: 655 MB of tables in the kernel) with one Sync from empty, then
// measures single backend changes (one weight change → new table, written atomically).
// Reported: full-sync-s and its peak RSS, and per change ns/op with p50-ms and p99-ms.
func BenchmarkReconcile10k(b *testing.B) {
	n := newNode(b)
	m := n.open(b, n.config(1<<16))
	const services, per = 10000, 10
	svcs := make([]*lbdv1.Service, services)
	for i := range services {
		var bes []*lbdv1.Backend
		for j := range per {
			id := uint32(i*per + j + 1)
			bes = append(bes, backend(id, fmt.Sprintf("198.18.%d.%d", 10+j, i%250+1), uint32(8000+i/250), active))
		}
		svcs[i] = service(uint32(i+1), fmt.Sprintf("svc-%d", i), fmt.Sprintf("203.0.113.%d", i%250+1), uint32(1000+i/250), 16381, bes...)
	}
	ctx := context.Background()
	start := time.Now()
	if _, err := m.Sync(ctx, svcs); err != nil {
		b.Fatal(err)
	}
	full := time.Since(start)
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	var lat []time.Duration
	i := 0
	for b.Loop() {
		svc := svcs[(i*7919)%services]
		svc.Backends[i%per].Weight = uint32(1 + (i/per)%3)
		t0 := time.Now()
		if _, err := m.Upsert(ctx, svc); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
		i++
	}
	slices.Sort(lat)
	b.ReportMetric(full.Seconds(), "full-sync-s")
	b.ReportMetric(float64(ru.Maxrss)/1024, "peak-RSS-MB")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

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
