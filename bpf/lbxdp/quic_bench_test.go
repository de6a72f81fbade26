//go:build linux

package lbxdp

import (
	"fmt"
	"testing"

	"github.com/lbd-dev/lbd/internal/testnet"
)

// quicBench is the setup of BenchmarkQUIC: a plain UDP service on vip4:443 (ID 1) and
// a QUIC-aware one on vip4:444 (ID 2), both balanced over the same 16 backends, the
// QUIC one with the server ID of backend 5; and the pairs of paths it compares.
type quicBench struct {
	e     *env
	h     *harness
	pairs []quicPair
}

// quicPair is a path of a QUIC service's packet and the plain UDP path it is compared
// with: the same payload bytes, one to each service.
type quicPair struct {
	name       string
	quic, udp  benchCase
	quicRoute  QUICRoute
	udpInserts bool // the UDP path inserts a conntrack entry per packet
	primed     bool // an Initial of the QUIC flow goes first in each run
}

// quicBenchPackets is the number of packets per measured run.
const quicBenchPackets = 1 << 18

func newQUICBench(b *testing.B, packets uint32) *quicBench {
	e := &env{topo: newTopo(b)}
	e.d = loadDatapath(b, Options{MaxServices: 64, MaxBackends: 256, ConntrackSize: 4 * packets})
	e.setGuard(b, 0)
	ids := make([]uint32, 16)
	for i := range ids {
		ids[i] = uint32(i + 1)
		e.addBackend(b, ids[i], fmt.Sprintf("198.18.20.%d", i+1), 8443, fmt.Sprintf("198.18.10.%d", i+1))
	}
	e.addService(b, svcSetup{ServiceKey{vip4, 443, ProtoUDP}, Service{ID: 1}, nil})
	e.addService(b, svcSetup{ServiceKey{vip4, 444, ProtoUDP}, Service{ID: 2, QUIC: quicCfg}, nil})
	e.setTable(b, 1, ids, 65537)
	e.setTable(b, 2, ids, 65537)
	if err := e.d.SetQUICServerID(2, sidB, 5); err != nil {
		b.Fatal(err)
	}

	short := quicShort(quicCID(1, sidB))
	// The harness holds frames of up to 256 bytes: the Initial is cut short, which
	// changes nothing for a datapath that reads its first 6 + 20 bytes.
	initial := quicLong(1, 0, quicCID(1, sidB))[:200]
	frame := func(port uint16, sport uint16, payload []byte) []byte {
		return quicPacket(sport, port, payload).Frame()
	}
	empty := func(b *testing.B) {
		if _, err := e.d.DeleteConntrackWhere(func(CTEntry) bool { return true }); err != nil {
			b.Fatal(err)
		}
	}
	// The QUIC flow's Initial went through first, as in a real connection: the 5-tuple
	// has a conntrack entry, which the routed packets find and do not use.
	primed := func(b *testing.B) {
		if v, _ := e.run(b, frame(444, 40001, initial)); v != XDPTx {
			b.Fatalf("the Initial of the established QUIC flow: verdict %v", v)
		}
	}
	q := &quicBench{e: e, h: newHarness(b, e.topo)}
	at := func(c benchCase) benchCase { c.packets = packets; return c }
	q.pairs = []quicPair{
		{"established", at(benchCase{frame: frame(444, 40001, short), harness: true, verdict: XDPTx, before: primed}),
			at(benchCase{frame: frame(443, 40001, short), harness: true, verdict: XDPTx}), QUICRouted, false, true},
		{"rebound", at(benchCase{frame: frame(444, 40002, short), harness: true, vary: true, verdict: XDPTx, before: empty}),
			at(benchCase{frame: frame(443, 40002, short), harness: true, vary: true, verdict: XDPTx, before: empty}), QUICRouted, true, false},
		{"initial", at(benchCase{frame: frame(444, 40003, initial), harness: true, vary: true, verdict: XDPTx, before: empty}),
			at(benchCase{frame: frame(443, 40003, initial), harness: true, vary: true, verdict: XDPTx, before: empty}), QUICClientCID, true, false},
	}
	return q
}

// measure runs both paths of p and returns their gross and baseline figures; the QUIC
// route counters must show that every QUIC packet took p.quicRoute, and the conntrack
// counters that the UDP path inserted an entry per packet when p says it does: if not,
// the error says which.
func (q *quicBench) measure(b *testing.B, p quicPair) (qg, qb, ug, ub []float64, err error) {
	b.Helper()
	routes := func() map[QUICRoute]uint64 {
		rs, err := q.e.d.QUICRoutes()
		if err != nil {
			b.Fatal(err)
		}
		m := map[QUICRoute]uint64{}
		for _, r := range rs {
			m[r.Route] = r.Count
		}
		return m
	}
	before := routes()
	qg, qb = q.h.measure(b, q.e.d.Program(), p.quic)
	after := routes()
	packets := uint64(benchRuns) * uint64(p.quic.packets)
	for r := QUICRouted; r < quicRoutes; r++ {
		want := uint64(0)
		if r == p.quicRoute {
			want = packets
		}
		// The priming Initial of each run is counted as a client's ID.
		if r == QUICClientCID && p.primed {
			want += benchRuns
		}
		if got := after[r] - before[r]; got != want {
			return nil, nil, nil, nil, fmt.Errorf("%s: %d packets counted %v, want %d: the benchmark does not measure the path it names", p.name, got, r, want)
		}
	}
	ctBefore, err := q.e.d.ConntrackEvents()
	if err != nil {
		b.Fatal(err)
	}
	ug, ub = q.h.measure(b, q.e.d.Program(), p.udp)
	ctAfter, err := q.e.d.ConntrackEvents()
	if err != nil {
		b.Fatal(err)
	}
	for i, ev := range ctAfter {
		if ev.Event != CTInserted {
			continue
		}
		n := ev.Count - ctBefore[i].Count
		if p.udpInserts && n != packets || !p.udpInserts && n > benchRuns {
			return nil, nil, nil, nil, fmt.Errorf("%s: the UDP path inserted %d conntrack entries in %d packets", p.name, n, packets)
		}
	}
	return qg, qb, ug, ub, nil
}

// BenchmarkQUIC measures the per-packet cost of a QUIC-aware service's paths against
// the plain UDP service's in the same run, with the kernel's clock and the harness of
// BenchmarkDatapath (each run paired with a baseline run of the empty program):
//
//	established: a short-header packet whose 5-tuple has a conntrack entry (its
//	    Initial's), routed by the server ID in its connection ID; against a UDP
//	    packet of an established flow;
//	rebound: short-header packets from a new source address and port each (NAT
//	    rebinding), routed by the server ID, nothing inserted; against a new UDP flow
//	    every packet (a conntrack insert each);
//	initial: an Initial (200 bytes) from a new source each, balanced by the 5-tuple
//	    (the Maglev table, a conntrack insert); against the same bytes as a new UDP
//	    flow.
//
// Reported per pair: net-ns/pkt of the QUIC path (median of gross minus baseline),
// udp-net-ns/pkt, and quic/udp, the ratio of the two.
func BenchmarkQUIC(b *testing.B) {
	q := newQUICBench(b, quicBenchPackets)
	for _, p := range q.pairs {
		b.Run(p.name, func(b *testing.B) {
			var qg, qb, ug, ub []float64
			for range b.N {
				g1, b1, g2, b2, err := q.measure(b, p)
				if err != nil {
					b.Fatal(err)
				}
				qg, qb, ug, ub = append(qg, g1...), append(qb, b1...), append(ug, g2...), append(ub, b2...)
			}
			qn, un := netOf(qg, qb), netOf(ug, ub)
			b.ReportMetric(median(qg), "ns/pkt")
			b.ReportMetric(median(qn), "net-ns/pkt")
			b.ReportMetric(median(un), "udp-net-ns/pkt")
			b.ReportMetric(median(qn)/median(un), "quic/udp")
		})
	}
}

// netOf is gross minus baseline, pair by pair.
func netOf(gross, base []float64) []float64 {
	out := make([]float64, len(gross))
	for i := range gross {
		out[i] = gross[i] - base[i]
	}
	return out
}

// TestQUICBenchPaths is the scaled-down run of BenchmarkQUIC in make test: each pair
// takes the paths it names (checked on the counters), with 64 packets per run.
func TestQUICBenchPaths(t *testing.T) {
	testnet.Require(t)
	var errs []error
	res := testing.Benchmark(func(b *testing.B) {
		q := newQUICBench(b, 64)
		for _, p := range q.pairs {
			if _, _, _, _, err := q.measure(b, p); err != nil {
				errs = append(errs, err)
			}
		}
	})
	if len(errs) > 0 || res.N == 0 {
		t.Fatalf("the benchmark's setup failed (%d runs) or its paths are not the ones it names: %v", res.N, errs)
	}
}
