//go:build linux

package lbxdp

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/lbd-dev/lbd/internal/pktgen"
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

// testRunAttr is union bpf_attr as BPF_PROG_TEST_RUN reads it. cilium/ebpf's
// Run does not return the kernel's duration, and Benchmark takes no context
// (the ingress ifindex that the FIB lookup needs), hence the raw call.
type testRunAttr struct {
	progFD      uint32
	retval      uint32
	dataSizeIn  uint32
	dataSizeOut uint32
	dataIn      uint64
	dataOut     uint64
	repeat      uint32
	duration    uint32
	ctxSizeIn   uint32
	ctxSizeOut  uint32
	ctxIn       uint64
	ctxOut      uint64
	flags       uint32
	cpu         uint32
	batchSize   uint32
	_           uint32
}

// testRun runs prog benchPackets times on frame and returns the verdict of the
// last run, the bytes it left and the kernel's mean time per run. The kernel
// times only the loop around the program, and stops the clock while the
// thread yields the CPU to other tasks (this machine's two cores are shared),
// which a wall clock around the syscall would count.
func testRun(prog *ebpf.Program, frame []byte, ingress int) (Verdict, []byte, float64, error) {
	md := XDPMD{DataEnd: uint32(len(frame)), IngressIfindex: uint32(ingress)}
	out := make([]byte, len(frame)+256)
	attr := testRunAttr{
		progFD:      uint32(prog.FD()),
		dataSizeIn:  uint32(len(frame)),
		dataSizeOut: uint32(len(out)),
		dataIn:      uint64(uintptr(unsafe.Pointer(&frame[0]))),
		dataOut:     uint64(uintptr(unsafe.Pointer(&out[0]))),
		repeat:      benchPackets,
		ctxSizeIn:   uint32(unsafe.Sizeof(md)),
		ctxIn:       uint64(uintptr(unsafe.Pointer(&md))),
	}
	for {
		_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_TEST_RUN, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
		runtime.KeepAlive(frame)
		runtime.KeepAlive(out)
		runtime.KeepAlive(&md)
		// A signal makes the kernel give up; it starts over, clock included.
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return 0, nil, 0, fmt.Errorf("run program: %w", errno)
		}
		return Verdict(attr.retval), out[:attr.dataSizeOut], float64(attr.duration), nil
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
}

// setTemplate points the harness at frame and target.
func (h *harness) setTemplate(b *testing.B, c benchCase, target *ebpf.Program) {
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
		h.tp.ns.Do(b, func() { v, out, ns, err = testRun(run, c.frame, h.tp.ifA) })
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

// BenchmarkDatapath measures lb_xdp through BPF_PROG_TEST_RUN, 2^20 packets
// per run, with the kernel's own clock (see testRun):
//
//	(a) a new TCP SYN flow every packet, 2^20 distinct flows per run; the
//	    conntrack map holds 1M, so after the first run every insert evicts
//	    the least recently used entry, as on a node whose table is full;
//	(a-room) the same into a conntrack map emptied before every run (outside
//	    the clock), as on a node whose garbage collector keeps room: inserts
//	    take free entries and evict nothing;
//	(b) a packet of an established flow;
//	(c) traffic to an address that is not a VIP, passed;
//	(d) a malformed frame (IPv4 header length 4), dropped;
//	a-floor-lru-insert: not lb_xdp but a program that only inserts a new
//	    40-byte key into a 1M-entry LRU hash (bench_wrap.c), the kernel's part
//	    of (a) that no program can avoid.
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
	e.d = loadDatapath(b, Options{MaxServices: 64, MaxBackends: 256})
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
	est := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 40001, DstPort: 80, Flags: pktgen.ACK, Payload: pktgen.Bytes(20)}.Frame()
	other := pktgen.Packet{Src: client4, Dst: netip.MustParseAddr("203.0.113.200"), SrcPort: 40002, DstPort: 80, Payload: pktgen.Bytes(20)}.Frame()
	bad := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 40003, DstPort: 80, Payload: pktgen.Bytes(20)}.Frame()
	bad[14] = 0x44 // IHL 4

	cases := []struct {
		name string
		benchCase
	}{
		{"a-new-flow", benchCase{syn, true, true, XDPTx, nil}},
		{"a-room-new-flow", benchCase{syn, true, true, XDPTx, func(b *testing.B) {
			if _, err := e.d.DeleteConntrackWhere(func(CTEntry) bool { return true }); err != nil {
				b.Fatal(err)
			}
		}}},
		{"b-established", benchCase{est, true, false, XDPTx, nil}},
		{"c-non-vip-pass", benchCase{other, false, false, XDPPass, nil}},
		{"d-malformed-drop", benchCase{bad, false, false, XDPDrop, nil}},
	}
	// The kernel's own cost of inserting a new conntrack-sized key into a 1M LRU hash,
	// nothing else: the floor under (a).
	b.Run("a-floor-lru-insert", func(b *testing.B) {
		var gross, base []float64
		for range b.N {
			for range benchRuns {
				var g, bs float64
				h.tp.ns.Do(b, func() {
					var err error
					if _, _, bs, err = testRun(h.objs.BenchPass, other, h.tp.ifA); err != nil {
						b.Fatal(err)
					}
					var v Verdict
					if v, _, g, err = testRun(h.objs.BenchCtInsert, other, h.tp.ifA); err != nil || v != XDPPass {
						b.Fatalf("insert run: verdict %v, %v", v, err)
					}
				})
				gross, base = append(gross, g), append(base, bs)
			}
		}
		report(b, gross, base)
	})
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var gross, base []float64
			for range b.N {
				g, bs := h.measure(b, e.d.Program(), c.benchCase)
				gross, base = append(gross, g...), append(base, bs...)
			}
			report(b, gross, base)
		})
	}
}
