//go:build linux

package lbxdp

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// benchPackets is the number of packets per measured run: (a) needs 1M
// distinct flows per run.
const benchPackets = 1 << 20

// benchRuns is how many runs each benchmark iteration measures; min, median
// and max over them are reported.
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

// measure runs benchRuns runs of benchPackets packets built from frame and
// returns ns per packet of each run. With the harness, target is tail-called
// after the frame is restored (and, with vary, given a new flow); without it,
// target runs directly on the frame, which is only valid for paths that leave
// the frame untouched, and that is checked.
func (h *harness) measure(b *testing.B, target *ebpf.Program, frame []byte, useHarness, vary bool, want Verdict) []float64 {
	b.Helper()
	prog := target
	if useHarness {
		t := benchwrapBwTemplate{Len: uint32(len(frame))}
		copy(t.Data[:], frame)
		if vary {
			t.Vary, t.SaddrOff, t.SportOff = 1, 14+12, 14+20
		}
		if err := h.objs.BwTmpl.Update(uint32(0), &t, ebpf.UpdateAny); err != nil {
			b.Fatal(err)
		}
		if err := h.objs.BwTarget.Update(uint32(0), target, ebpf.UpdateAny); err != nil {
			b.Fatal(err)
		}
		prog = h.objs.BenchWrap
	}
	var res []float64
	inNS(b, h.tp.ns, func() {
		for range benchRuns {
			var start time.Time
			opts := ebpf.RunOptions{
				Data:    frame,
				DataOut: make([]byte, len(frame)+256),
				Repeat:  benchPackets,
				Context: XDPMD{DataEnd: uint32(len(frame)), IngressIfindex: uint32(h.tp.ifA)},
				// An interrupted run starts over: so does its clock.
				Reset: func() { start = time.Now() },
			}
			start = time.Now()
			ret, err := prog.Run(&opts)
			elapsed := time.Since(start)
			if err != nil {
				b.Fatal(err)
			}
			if Verdict(ret) != want {
				b.Fatalf("verdict %v, want %v", Verdict(ret), want)
			}
			if !useHarness && !bytes.Equal(opts.DataOut, frame) {
				b.Fatal("the program modified the frame: measure it with the harness")
			}
			res = append(res, float64(elapsed.Nanoseconds())/benchPackets)
		}
	})
	return res
}

func report(b *testing.B, runs, baseline []float64) {
	slices.Sort(runs)
	b.ReportMetric(runs[0], "min-ns/pkt")
	b.ReportMetric(runs[len(runs)/2], "ns/pkt")
	b.ReportMetric(runs[len(runs)-1], "max-ns/pkt")
	if baseline != nil {
		b.ReportMetric(runs[len(runs)/2]-baseline[len(baseline)/2], "net-ns/pkt")
	}
}

// BenchmarkDatapath measures lb_xdp through BPF_PROG_TEST_RUN, 2^20 packets
// per run, reporting min, median (ns/pkt) and max over benchRuns runs:
// (a) a new flow every packet, 2^20 distinct flows per run (conntrack holds
// 1M: later runs evict), (b) an established flow, (c) traffic for another
// address that passes, (d) a malformed frame dropped. (a) and (b) modify the
// frame, so the harness of bench_wrap.c restores it before every packet;
// (c) and (d) leave it untouched (checked), so they run directly. Two
// baselines measured in the same run — the harness around an empty program,
// and the empty program alone — give net-ns/pkt, the program's own cost.
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

	syn := pkt{src: client4, dst: vip4, sport: 40000, dport: 80, payload: 20}.build(b)
	est := pkt{src: client4, dst: vip4, sport: 40001, dport: 80, tcpFlags: tcpACK, payload: 20}.build(b)
	other := pkt{src: client4, dst: netip.MustParseAddr("203.0.113.200"), sport: 40002, dport: 80, payload: 20}.build(b)
	bad := pkt{src: client4, dst: vip4, sport: 40003, dport: 80, payload: 20}.build(b)
	bad[14] = 0x44 // IHL 4

	var harnessBase, emptyBase []float64
	b.Run("baseline-harness", func(b *testing.B) {
		for range b.N {
			harnessBase = h.measure(b, h.objs.BenchPass, est, true, false, XDPPass)
		}
		report(b, slices.Clone(harnessBase), nil)
	})
	b.Run("baseline-empty", func(b *testing.B) {
		for range b.N {
			emptyBase = h.measure(b, h.objs.BenchPass, est, false, false, XDPPass)
		}
		report(b, slices.Clone(emptyBase), nil)
	})
	cases := []struct {
		name    string
		frame   []byte
		harness bool
		vary    bool
		verdict Verdict
	}{
		{"a-new-flow", syn, true, true, XDPTx},
		{"b-established", est, true, false, XDPTx},
		{"c-non-vip-pass", other, false, false, XDPPass},
		{"d-malformed-drop", bad, false, false, XDPDrop},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var runs []float64
			for range b.N {
				runs = append(runs, h.measure(b, e.d.Program(), c.frame, c.harness, c.vary, c.verdict)...)
			}
			base := emptyBase
			if c.harness {
				base = harnessBase
			}
			report(b, runs, slices.Sorted(slices.Values(base)))
		})
	}
}
