//go:build linux

package backendtc

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/lbd-dev/lbd/internal/pktgen"
)

// emptyProgram is the baseline: a tc program that only returns TCX_NEXT, so the
// kernel's per-run overhead (timer reads, skb context) can be subtracted.
func emptyProgram(b *testing.B) *ebpf.Program {
	b.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SchedCLS,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()},
		License:      "Dual BSD/GPL",
	})
	if err != nil {
		b.Fatalf("load empty program: %v", err)
	}
	b.Cleanup(func() { p.Close() })
	return p
}

// benchPackets measures prog on frame, one BPF_PROG_TEST_RUN call per packet so that
// every run sees the original frame (Repeat would feed the decapsulated or rewritten
// packet back in). The kernel reports the run time of each call; between calls,
// after runs in untimed Go code, restores map state. Reported: ns/pkt for the
// program, for the empty baseline interleaved with it, and their difference.
func benchPackets(b *testing.B, prog *ebpf.Program, frame []byte, want uint32, after func()) {
	empty := emptyProgram(b)
	var progTime, emptyTime time.Duration
	b.ResetTimer()
	for range b.N {
		ret, d, err := prog.Benchmark(frame, 1, nil)
		if err != nil {
			b.Fatal(err)
		}
		if ret != want {
			b.Fatalf("verdict %#x, want %#x", ret, want)
		}
		progTime += d
		if _, d, err = empty.Benchmark(frame, 1, nil); err != nil {
			b.Fatal(err)
		}
		emptyTime += d
		if after != nil {
			after()
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(progTime.Nanoseconds())/n, "ns/pkt")
	b.ReportMetric(float64(emptyTime.Nanoseconds())/n, "empty-ns/pkt")
	b.ReportMetric(float64((progTime-emptyTime).Nanoseconds())/n, "net-ns/pkt")
}

func BenchmarkIngress(b *testing.B) {
	d := newDatapath(b)
	frame := v4Encap(pktgen.DSROption(vipV4)).Frame(tcpSyn.request())
	key, err := natKey(NATKey{Proto: ProtoTCP, Backend: backendV4, Client: clientV4})
	if err != nil {
		b.Fatal(err)
	}

	b.Run("decap+NAT-insert", func(b *testing.B) {
		benchPackets(b, d.IngressProgram(), frame, verdictNext, func() {
			if err := d.objs.BetcNat.Delete(&key); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("decap+NAT-refresh", func(b *testing.B) {
		if v, _ := run(b, d.IngressProgram(), frame); v != verdictNext {
			b.Fatalf("verdict %#x", v)
		}
		benchPackets(b, d.IngressProgram(), frame, verdictNext, nil)
	})
	b.Run("non-matching-pass", func(b *testing.B) {
		plain := pktgen.Packet{SrcMAC: lbMAC, DstMAC: nodeMAC}.Wrap(tcpSyn.request())
		benchPackets(b, d.IngressProgram(), plain, verdictNext, nil)
	})
	// lbd's option in a Geneve control packet: dropped (CounterDropBadGeneve), with
	// the monitor off as loaded, then while `lbctl monitor` listens and nobody reads:
	// a second's worth of events, then each drop is held back by the rate limit (or
	// the full ring).
	oam := v4Encap(pktgen.DSROption(vipV4))
	oam.OAM = true
	bad := oam.Frame(tcpSyn.request())
	b.Run("bad-geneve-drop", func(b *testing.B) {
		benchPackets(b, d.IngressProgram(), bad, verdictDrop, nil)
	})
	b.Run("bad-geneve-drop-monitored", func(b *testing.B) {
		if err := d.SetMonitor(MonitorConfig{Drops: true, Rate: 1000}); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { d.SetMonitor(MonitorConfig{}) })
		benchPackets(b, d.IngressProgram(), bad, verdictDrop, nil)
	})
}

func BenchmarkEgress(b *testing.B) {
	d := newDatapath(b)
	f := flow{proto: tcpSyn.proto, client: clientV4, backend: backendV4, flags: pktgen.ACK,
		payload: make([]byte, 100)}
	if v, _ := run(b, d.IngressProgram(), v4Encap(pktgen.DSROption(vipV4)).Frame(f.request())); v != verdictNext {
		b.Fatalf("verdict %#x", v)
	}
	b.Run("SNAT-hit", func(b *testing.B) {
		benchPackets(b, d.EgressProgram(), f.reply(f.backend).Frame(), verdictNext, nil)
	})
	b.Run("non-matching-pass", func(b *testing.B) {
		other := f
		other.client = netip.AddrPortFrom(f.client.Addr(), f.client.Port()+1)
		benchPackets(b, d.EgressProgram(), other.reply(other.backend).Frame(), verdictNext, nil)
	})
}
