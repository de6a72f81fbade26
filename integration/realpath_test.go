//go:build linux

package integration

import (
	"strings"
	"testing"

	"github.com/lbd-dev/lbd/internal/testnet"
	"github.com/lbd-dev/lbd/internal/xdpgen"
)

// The real-path benchmark and its sanity test: the same 64-byte frames, injected at
// the LB node's uplink, forwarded by lbd, by the kernel's IP forwarding and by an
// nftables DNAT balancer in turn (realpath_topo_test.go has the topology and the
// method; docs/operations.md how to read the figures).

// rpSanityPackets is how many frames the sanity test sends per forwarder and case.
const rpSanityPackets = 50_000

// loadGens loads one injector per traffic case, shared by the forwarders: the flow
// sequence goes on, so that "new flow per packet" is new to each of them. prio is the
// injector's SCHED_FIFO priority while it sends (0: none).
func loadGens(tb testing.TB, rp *realPath, prio int) map[string]*xdpgen.Gen {
	tb.Helper()
	gens := map[string]*xdpgen.Gen{}
	for _, c := range trafficCases() {
		c.cfg.Pacer, c.cfg.Pin, c.cfg.CPU, c.cfg.Priority = rp.pacer, true, genCPU, prio
		g, err := xdpgen.Load(c.cfg)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { g.Close() })
		gens[c.name] = g
	}
	return gens
}

// TestRealPath checks the benchmark's topology with every forwarder, paced so that
// each must deliver every frame: both backends together count all of them, and lbd
// counts as many for its service. It asserts nothing about speed.
func TestRealPath(t *testing.T) {
	testnet.Require(t, "nft")
	rp := newRealPath(t)
	gens := loadGens(t, rp, 0)
	for _, fw := range forwarders {
		rp.tb = t
		t.Run(fw.name, func(t *testing.T) {
			rp.tb = t
			fw.setup(rp)
			for _, c := range trafficCases() {
				g := gens[c.name]
				// The first frames wait for the backends' addresses to resolve.
				rp.measure(g, 256, true)
				var lbd0 uint64
				if rp.lbd != nil {
					lbd0, _ = rp.lbdPackets()
				}
				before := rp.perBackend()
				s := rp.measure(g, rpSanityPackets, true)
				after := rp.perBackend()
				t.Logf("%s: %d sent, %d forwarded (be1 %d, be2 %d), LB node CPU %v (%.0f ns/packet)", c.name,
					s.sent, s.forwarded, after[0]-before[0], after[1]-before[1], s.lbCPU, s.nsPerPkt())
				if s.sent != rpSanityPackets || s.forwarded != rpSanityPackets {
					t.Errorf("%s: %d sent, %d forwarded; want %d", c.name, s.sent, s.forwarded, rpSanityPackets)
				}
				if c.name == "new_flow_per_packet" && (after[0] == before[0] || after[1] == before[1]) {
					t.Errorf("%s: new flows reached one backend only: %v then %v", c.name, before, after)
				}
				if rp.lbd != nil {
					if n, _ := rp.lbdPackets(); n-lbd0 != s.forwarded {
						t.Errorf("%s: lbd counted %d packets for the service, the backends %d", c.name, n-lbd0, s.forwarded)
					}
				}
			}
			if fw.teardown != nil {
				fw.teardown(rp)
			}
		})
	}
}

// rpBenchPackets is how many frames one measurement offers: a few seconds of the
// injector, so that one measurement is enough for the benchmark's loop.
const rpBenchPackets = 20_000_000

// rpFill is how many frames go before a measurement: as many new flows fill lbd's
// conntrack (1M entries by default) and the kernel's (nf_conntrack_max, 262,144 here),
// so that "new flow per packet" is measured with full tables, as a busy LB node has.
const rpFill = 2_000_000

// BenchmarkRealPath measures each forwarder on the same topology in the same run:
// forwarded packets per second (Mpps, counted at the backends), the LB node's CPU time
// per forwarded packet (ns/pkt, its NAPI thread's time), what the injector offered
// (offered-Mpps) and how busy the LB node's CPU was (lb-busy, 1 = saturated). lbd's
// results also give its ratios to the others from the same run: x-kernel and x-nft
// for packets per second, x-kernel-cpu and x-nft-cpu for CPU time per packet (how
// many times less lbd needs).
func BenchmarkRealPath(b *testing.B) {
	testnet.Require(b, "nft")
	rp := newRealPath(b)
	gens := loadGens(b, rp, rpPrioGen)
	results := map[string]sample{}
	for _, fw := range forwarders {
		b.Run(fw.name, func(b *testing.B) {
			rp.tb = b
			defer func() { rp.tb = nil }()
			fw.setup(rp)
			for _, c := range trafficCases() {
				g := gens[c.name]
				rp.measure(g, 256, true) // resolve the backends' addresses
				rp.measure(g, rpFill, false)
				b.Run(c.name, func(b *testing.B) {
					rp.tb = b
					var s sample
					var events0 map[string]uint64
					if rp.lbd != nil {
						events0 = rp.lbdEvents()
					}
					for b.Loop() {
						m := rp.measure(g, rpBenchPackets, false)
						s.sent, s.forwarded = s.sent+m.sent, s.forwarded+m.forwarded
						s.dur, s.lbCPU = s.dur+m.dur, s.lbCPU+m.lbCPU
					}
					// What lbd's conntrack did with each frame: which path was measured.
					if rp.lbd != nil {
						for ev, n := range rp.lbdEvents() {
							switch ev {
							case "inserted", "guard_skipped", "insert_failed":
								b.ReportMetric(float64(n-events0[ev])/float64(s.forwarded), ev+"/pkt")
							}
						}
					}
					if s.forwarded == 0 {
						b.Fatalf("nothing forwarded of %d frames", s.sent)
					}
					results[fw.name+"/"+c.name] = s
					b.ReportMetric(0, "ns/op")
					b.ReportMetric(s.pps()/1e6, "Mpps")
					b.ReportMetric(s.nsPerPkt(), "ns/pkt")
					b.ReportMetric(s.offeredPPS()/1e6, "offered-Mpps")
					b.ReportMetric(s.lbCPU.Seconds()/s.dur.Seconds(), "lb-busy")
					if !strings.HasPrefix(fw.name, "lbd") {
						return
					}
					for other, unit := range map[string]string{"kernel": "x-kernel", "nftables": "x-nft"} {
						if o, ok := results[other+"/"+c.name]; ok {
							b.ReportMetric(s.pps()/o.pps(), unit)
							b.ReportMetric(o.nsPerPkt()/s.nsPerPkt(), unit+"-cpu")
						}
					}
				})
				rp.tb = b
			}
			if fw.teardown != nil {
				fw.teardown(rp)
			}
		})
	}
}
