//go:build linux

package lbxdp

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/lbd-dev/lbd/internal/pktgen"
	"github.com/lbd-dev/lbd/internal/progrun"
	"golang.org/x/sys/unix"
)

// benchPackets is the number of packets per measured run: (a) needs 1M
// distinct flows per run.
const benchPackets = 1 << 20

// benchRuns is how many (baseline, program) run pairs one benchmark iteration
// measures; min, median and max over them are reported.
const benchRuns = 5

type harness struct {
	objs benchwrapObjects
	tp   *topo
}

func newHarness(b *testing.B, tp *topo) *harness {
	b.Helper()
	h := &harness{tp: tp}
	if err := loadBenchwrapObjects(&h.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			b.Fatalf("%+v", ve)
		}
		b.Fatal(err)
	}
	b.Cleanup(func() { h.objs.Close() })
	return h
}

// testRunN runs prog repeat times on frame and returns the verdict of the last
// run, the bytes it left and the kernel's mean time per run. The kernel times only
// the loop around the program, and stops the clock while the thread yields the CPU
// to other tasks (this machine's two cores are shared), which a wall clock around
// the syscall would count.
func testRunN(prog *ebpf.Program, frame []byte, ingress int, repeat uint32) (Verdict, []byte, float64, error) {
	md := XDPMD{DataEnd: uint32(len(frame)), IngressIfindex: uint32(ingress)}
	out := make([]byte, len(frame)+256)
	// The raw call (package progrun): cilium/ebpf's Run does not return the kernel's
	// duration, and Benchmark takes no context (the ingress ifindex that the FIB lookup
	// needs).
	attr := progrun.Attr{
		ProgFD:      uint32(prog.FD()),
		DataSizeIn:  uint32(len(frame)),
		DataSizeOut: uint32(len(out)),
		DataIn:      uint64(uintptr(unsafe.Pointer(&frame[0]))),
		DataOut:     uint64(uintptr(unsafe.Pointer(&out[0]))),
		Repeat:      repeat,
		CtxSizeIn:   uint32(unsafe.Sizeof(md)),
		CtxIn:       uint64(uintptr(unsafe.Pointer(&md))),
	}
	for {
		err := progrun.Run(&attr)
		runtime.KeepAlive(frame)
		runtime.KeepAlive(out)
		runtime.KeepAlive(&md)
		// A signal makes the kernel give up; it starts over, clock included.
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 0, nil, 0, fmt.Errorf("run program: %w", err)
		}
		return Verdict(attr.Retval), out[:attr.DataSizeOut], float64(attr.Duration), nil
	}
}

// benchCase is one measured path and the run that serves as its baseline.
type benchCase struct {
	frame   []byte
	harness bool // restore the frame before every packet (the path modifies it)
	vary    bool // with harness: a new flow every packet
	verdict Verdict
	// before, if set, runs before every measured run of the program (not of the
	// baseline), outside the kernel's clock.
	before func(b *testing.B)
	// packets per run; 0: benchPackets.
	packets uint32
}

// setTemplate points the harness at frame and target.
func (h *harness) setTemplate(b testing.TB, c benchCase, target *ebpf.Program) {
	b.Helper()
	t := benchwrapBwTemplate{Len: uint32(len(c.frame))}
	copy(t.Data[:], c.frame)
	if c.vary {
		t.Vary, t.SaddrOff, t.SportOff = 1, 14+12, 14+20
	}
	if err := h.objs.BwTmpl.Update(uint32(0), &t, ebpf.UpdateAny); err != nil {
		b.Fatal(err)
	}
	if err := h.objs.BwTarget.Update(uint32(0), target, ebpf.UpdateAny); err != nil {
		b.Fatal(err)
	}
}

// measure returns the ns/packet of benchRuns runs of the program and of its
// baseline, alternating so that both see the same load. See BenchmarkDatapath.
func (h *harness) measure(b *testing.B, prog *ebpf.Program, c benchCase) (gross, base []float64) {
	b.Helper()
	one := func(target *ebpf.Program, want Verdict) float64 {
		run := target
		if c.harness {
			h.setTemplate(b, c, target)
			run = h.objs.BenchWrap
		}
		var (
			v   Verdict
			out []byte
			ns  float64
			err error
		)
		h.tp.ns.Do(b, func() { v, out, ns, err = testRunN(run, c.frame, h.tp.ifA, cmp.Or(c.packets, benchPackets)) })
		if err != nil {
			b.Fatal(err)
		}
		if v != want {
			b.Fatalf("verdict %v, want %v", v, want)
		}
		if !c.harness && !slices.Equal(out, c.frame) {
			b.Fatal("the program modified the frame: measure it with the harness")
		}
		return ns
	}
	for range benchRuns {
		base = append(base, one(h.objs.BenchPass, XDPPass))
		if c.before != nil {
			c.before(b)
		}
		gross = append(gross, one(prog, c.verdict))
	}
	return gross, base
}

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	return s[len(s)/2]
}

// report publishes min, median (ns/pkt) and max of the gross runs, the median
// baseline, and net-ns/pkt: the median of gross minus baseline over the
// pairs, with its min and max.
func report(b *testing.B, gross, base []float64) {
	net := make([]float64, len(gross))
	for i := range gross {
		net[i] = gross[i] - base[i]
	}
	b.ReportMetric(slices.Min(gross), "min-ns/pkt")
	b.ReportMetric(median(gross), "ns/pkt")
	b.ReportMetric(slices.Max(gross), "max-ns/pkt")
	b.ReportMetric(median(base), "base-ns/pkt")
	b.ReportMetric(slices.Min(net), "min-net-ns/pkt")
	b.ReportMetric(median(net), "net-ns/pkt")
	b.ReportMetric(slices.Max(net), "max-net-ns/pkt")
}

// BenchmarkDatapath measures lb_xdp through BPF_PROG_TEST_RUN with the kernel's
// own clock (see testRun), conntrack sized for benchCapacity flows (its map holds
// a quarter more) and the flood guard off, so that every new flow pays its insert:
//
//	(a) a new TCP SYN flow every packet into a conntrack table filled to its
//	    capacity (refilled before every run, outside the clock), benchHeadroom
//	    packets per run: as many as the headroom holds, so that every insert
//	    finds a free entry, as on a node whose collector keeps up;
//	(a-ack) the same with ACK-only packets (a flow first seen mid-connection:
//	    a tentative entry);
//	(a-empty) new SYN flows into an empty table, benchPackets per run;
//	(a-guard) new SYN flows with the flood guard engaged: balanced by the
//	    Maglev table, not recorded;
//	(b) a packet of an established flow;
//	(c) traffic to an address that is not a VIP, passed;
//	(d) a malformed frame (IPv4 header length 4), dropped; and the same while the
//	    packet monitor is on (d-malformed-drop-monitored: nobody reads its ring,
//	    so past the first second's events each drop is held back by the rate
//	    limit), which (d) is the baseline of;
//	a-floor-lru-insert: not lb_xdp but a program that only inserts a new
//	    40-byte key with a 40-byte value into a full 1M-entry LRU hash
//	    (bench_wrap.c): the floor of any design that evicts on insert, which
//	    (a) is compared with.
//
// (a) and (b) encapsulate, so the harness of bench_wrap.c restores the frame
// before every packet (and for (a) writes a new source address and port),
// then tail-calls lb_xdp. (c) and (d) leave the frame untouched (checked) and
// run directly.
//
// Every run of the program is paired with a baseline run of the same work
// minus the program: the empty XDP program in its place, that is through the
// same harness with the same template and flow variation for (a) and (b)
// (the harness undoes the encapsulation with a call it makes whatever the
// target did, so its cost does not depend on the target), and directly with
// the same frame and context for (c) and (d). Baseline and program runs
// alternate, so both see the same load from the other tenants of the machine.
//
// Reported per case, over benchRuns pairs per iteration: min-ns/pkt,
// ns/pkt (median) and max-ns/pkt of the gross cost, base-ns/pkt (median
// baseline), and net-ns/pkt = median over the pairs of gross minus baseline,
// with min-net-ns/pkt and max-net-ns/pkt: the program's own cost. The net
// cost of (a) and (b) still includes what the program's memory traffic costs
// the harness (cache lines it evicts), which is part of running it.
func BenchmarkDatapath(b *testing.B) {
	e := &env{topo: newTopo(b)}
	e.d = loadDatapath(b, Options{MaxServices: 64, MaxBackends: 256, ConntrackSize: benchCapacity})
	e.setGuard(b, 0)
	for i := uint32(1); i <= 16; i++ {
		e.addBackend(b, i, fmt.Sprintf("198.18.20.%d", i), 8080, fmt.Sprintf("198.18.10.%d", i))
	}
	ids := make([]uint32, 16)
	for i := range ids {
		ids[i] = uint32(i + 1)
	}
	if err := e.d.UpsertService(ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1}); err != nil {
		b.Fatal(err)
	}
	e.setTable(b, 1, ids, 65537)
	h := newHarness(b, e.topo)

	syn := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 40000, DstPort: 80, Payload: pktgen.Bytes(20)}.Frame()
	ack := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 40000, DstPort: 80, Flags: pktgen.ACK, Payload: pktgen.Bytes(20)}.Frame()
	est := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 40001, DstPort: 80, Flags: pktgen.ACK, Payload: pktgen.Bytes(20)}.Frame()
	other := pktgen.Packet{Src: client4, Dst: netip.MustParseAddr("203.0.113.200"), SrcPort: 40002, DstPort: 80, Payload: pktgen.Bytes(20)}.Frame()
	bad := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 40003, DstPort: 80, Payload: pktgen.Bytes(20)}.Frame()
	bad[14] = 0x44 // IHL 4

	// The flows the harness varies through are in 198.18.0.0/15; the table is
	// filled with others.
	harnessFlow := func(c CTEntry) bool { return benchVaried.Contains(c.Flow.Src.Addr()) }
	atCapacity := func(b *testing.B) {
		if _, err := e.d.DeleteConntrackWhere(harnessFlow); err != nil {
			b.Fatal(err)
		}
		n := 0
		if err := e.d.Conntrack(func(CTEntry) bool { n++; return true }); err != nil {
			b.Fatal(err)
		}
		if n != benchCapacity {
			fillConntrack(b, e.d, benchCapacity)
		}
	}
	empty := func(b *testing.B) {
		if _, err := e.d.DeleteConntrackWhere(func(CTEntry) bool { return true }); err != nil {
			b.Fatal(err)
		}
	}
	cases := []struct {
		name string
		benchCase
	}{
		{"a-new-flow", benchCase{frame: syn, harness: true, vary: true, verdict: XDPTx, before: atCapacity, packets: benchHeadroom}},
		{"a-ack-new-flow", benchCase{frame: ack, harness: true, vary: true, verdict: XDPTx, before: atCapacity, packets: benchHeadroom}},
		{"a-empty-new-flow", benchCase{frame: syn, harness: true, vary: true, verdict: XDPTx, before: empty}},
		{"a-guard-new-flow", benchCase{frame: syn, harness: true, vary: true, verdict: XDPTx, before: func(b *testing.B) {
			empty(b)
			e.setGuard(b, 1)
		}}},
		{"b-established", benchCase{frame: est, harness: true, verdict: XDPTx, before: func(b *testing.B) { e.setGuard(b, 0) }}},
		{"c-non-vip-pass", benchCase{frame: other, verdict: XDPPass}},
		{"d-malformed-drop", benchCase{frame: bad, verdict: XDPDrop}},
		// (d) while `lbctl monitor` listens and nobody reads: a second's worth of
		// events, then each drop is held back by the rate limit (or the full ring).
		{"d-malformed-drop-monitored", benchCase{frame: bad, verdict: XDPDrop, before: func(b *testing.B) {
			if err := e.d.SetMonitor(MonitorConfig{Reasons: true, Rate: 1000}); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { e.d.SetMonitor(MonitorConfig{}) })
		}}},
	}
	// The floors under (a): the kernel's cost of inserting the packet's flow,
	// nothing else, into a full LRU (every insert evicts) and into a preallocated
	// hash of conntrack's layout filled to benchCapacity, with the same harness,
	// frames and packets per run as (a).
	floors := []struct {
		name   string
		prog   *ebpf.Program
		before func(b *testing.B)
	}{
		{"a-floor-lru-insert", h.objs.BenchCtLruInsert, nil},
		{"a-floor-lru16-insert", h.objs.BenchCtLru16Insert, nil},
		{"a-floor-hash-insert", h.objs.BenchCtHashInsert, func(b *testing.B) { clearVaried(b, h.objs.BwCtHash) }},
	}
	fillFloor(b, h.objs.BwCtHash, benchCapacity)
	for _, f := range floors {
		b.Run(f.name, func(b *testing.B) {
			c := benchCase{frame: syn, harness: true, vary: true, verdict: XDPPass, before: f.before, packets: benchHeadroom}
			if f.before == nil {
				// Fill the LRU first, so that every measured insert evicts.
				h.setTemplate(b, c, f.prog)
				h.tp.ns.Do(b, func() {
					if _, _, _, err := testRunN(h.objs.BenchWrap, syn, h.tp.ifA, 1<<20+benchHeadroom); err != nil {
						b.Fatal(err)
					}
				})
			}
			var gross, base []float64
			for range b.N {
				g, bs := h.measure(b, f.prog, c)
				gross, base = append(gross, g...), append(base, bs...)
			}
			report(b, gross, base)
		})
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var gross, base []float64
			before, err := e.d.ConntrackEvents()
			if err != nil {
				b.Fatal(err)
			}
			for range b.N {
				g, bs := h.measure(b, e.d.Program(), c.benchCase)
				gross, base = append(gross, g...), append(base, bs...)
			}
			report(b, gross, base)
			reportEvents(b, e.d, before, len(gross)*int(cmp.Or(c.packets, benchPackets)))
		})
	}
}

// benchCapacity is the conntrack capacity of BenchmarkDatapath, benchHeadroom
// the free entries its map has when that many are in use.
const (
	benchCapacity = 1 << 20
	benchHeadroom = benchCapacity / 4
)

// benchVaried holds the client addresses the harness varies through.
var benchVaried = netip.MustParsePrefix("198.18.0.0/15")

// fillConntrack fills the conntrack table with n established flows from
// 10.0.0.0/8, replacing what is there.
func fillConntrack(b *testing.B, d *Datapath, n int) {
	b.Helper()
	if _, err := d.DeleteConntrackWhere(func(CTEntry) bool { return true }); err != nil {
		b.Fatal(err)
	}
	now := MonotonicNow()
	entries := make([]CTEntry, 0, n)
	for i := range n {
		src := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		entries = append(entries, CTEntry{
			Flow:      Flow{Src: netip.AddrPortFrom(src, 1024), Dst: netip.AddrPortFrom(vip4, 80), Proto: ProtoTCP},
			BackendID: 1, ServiceID: 1, State: CTEstablished, LastSeen: now,
		})
	}
	if w, err := d.RestoreConntrack(entries); err != nil || w != n {
		b.Fatalf("fill conntrack: wrote %d of %d: %v", w, n, err)
	}
}

// reportEvents publishes what conntrack did per measured packet: inserts,
// guard skips and failed inserts, so that a case's figure says which path it
// measured.
func reportEvents(b *testing.B, d *Datapath, before []CTEventCount, packets int) {
	after, err := d.ConntrackEvents()
	if err != nil {
		b.Fatal(err)
	}
	for i, ev := range after {
		switch ev.Event {
		case CTInserted, CTGuardSkipped, CTInsertFailed:
			b.ReportMetric(float64(ev.Count-before[i].Count)/float64(packets), ev.Event.String()+"/pkt")
		}
	}
}

// fillFloor fills bw_ct_hash with n flows from 10.0.0.0/8, which the harness
// never sends.
func fillFloor(b *testing.B, m *ebpf.Map, n int) {
	b.Helper()
	keys := make([]benchwrapBwCt4Key, n)
	vals := make([]benchwrapBwCtVal, n)
	for i := range keys {
		keys[i].Saddr = 10 | uint32(i)<<8 // 10.x.y.z in network order
		keys[i].Proto = ProtoTCP
	}
	if _, err := m.BatchUpdate(keys, vals, nil); err != nil {
		b.Fatal(err)
	}
}

// clearVaried deletes the flows the harness inserted into bw_ct_hash.
func clearVaried(b *testing.B, m *ebpf.Map) {
	b.Helper()
	var (
		k      benchwrapBwCt4Key
		v      benchwrapBwCtVal
		doomed []benchwrapBwCt4Key
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if k.Saddr&0xff != 10 {
			doomed = append(doomed, k)
		}
	}
	if err := it.Err(); err != nil {
		b.Fatal(err)
	}
	if len(doomed) > 0 {
		if _, err := m.BatchDelete(doomed, nil); err != nil {
			b.Fatal(err)
		}
	}
}
