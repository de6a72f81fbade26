//go:build linux

package lbxdp

import (
	"net/netip"
	"testing"

	"github.com/lbd-dev/lbd/internal/pktgen"
)

// TestNoNeighbourPassesEncapsulated: a route whose next hop has no neighbour entry (a
// freshly booted host) is not a failure. The packet is encapsulated as usual and passed
// to the kernel, still addressed to this node's MAC, with the backend's node as outer
// destination, so the kernel resolves the neighbour and forwards it; it is counted as
// no_neighbour. The VIP packet itself is never passed up (it would loop).
func TestNoNeighbourPassesEncapsulated(t *testing.T) {
	e := newEnv(t)
	e.addBackend(t, 1, "198.18.20.1", 8080, "198.18.13.1") // via 198.18.0.3: no neighbour
	e.addService(t, svcSetup{ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1}, []uint32{1}})
	p := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 40000, DstPort: 80}
	in := p.Frame()
	before := e.drops(t)[PassNoNeighbour].Packets

	v, out := e.run(t, in)
	if v != XDPPass {
		t.Fatalf("verdict %v, want XDP_PASS", v)
	}
	if after := e.drops(t)[PassNoNeighbour].Packets; after != before+1 {
		t.Errorf("no_neighbour counter %d -> %d, want +1", before, after)
	}
	d := pktgen.DecodeGeneve(t, out)
	if d.Eth.DstMAC.String() != pktgen.Decode(t, in).Eth.DstMAC.String() {
		t.Errorf("outer Ethernet destination %v, want the frame's own %v (this node)", d.Eth.DstMAC, pktgen.Decode(t, in).Eth.DstMAC)
	}
	if d.Src() != src4 || d.Dst() != netip.MustParseAddr("198.18.13.1") {
		t.Errorf("outer %v -> %v, want %v -> 198.18.13.1", d.Src(), d.Dst(), src4)
	}
	if got := d.Inner.Dst(); got != netip.MustParseAddr("198.18.20.1") {
		t.Errorf("inner destination %v, want the backend 198.18.20.1", got)
	}

	// The trace says why, with the FIB's answer.
	var r TraceResult
	var err error
	e.ns.Do(t, func() { r, err = e.d.TraceResult(in, e.ifA) })
	if err != nil {
		t.Fatal(err)
	}
	if r.Verdict != XDPPass || !r.HasReason || r.Reason != PassNoNeighbour || !r.FIBLookedUp || r.FIBResult != 7 {
		t.Errorf("trace %+v, want XDP_PASS for no_neighbour after FIB result 7 (NO_NEIGH)", r)
	}
	// A trace has no side effects.
	if after := e.drops(t)[PassNoNeighbour].Packets; after != before+1 {
		t.Errorf("the trace counted: no_neighbour %d, want %d", after, before+1)
	}

	// Once the neighbour is resolved, the same flow goes out by XDP_TX.
	e.ns.IP(t, "neigh replace 198.18.0.3 lladdr 02:00:00:00:00:33 dev "+e.devA+" nud reachable")
	if err := e.d.FlushRouteCache(); err != nil {
		t.Fatal(err)
	}
	if v, out := e.run(t, in); v != XDPTx || pktgen.DecodeGeneve(t, out).Eth.DstMAC.String() != "02:00:00:00:00:33" {
		t.Errorf("after the neighbour resolved: verdict %v", v)
	}
}

// TestTraceReasons: a trace reports the reason the program counted, not a guess.
func TestTraceReasons(t *testing.T) {
	e := newEnv(t)
	e.addBackend(t, 1, "198.18.20.1", 8080, "198.18.10.1")
	e.addBackend(t, 2, "198.18.20.2", 8080, "198.18.14.2") // unreachable route
	e.addService(t, svcSetup{ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1}, []uint32{1}})
	e.addService(t, svcSetup{ServiceKey{vip4, 81, ProtoTCP}, Service{ID: 2}, []uint32{2}})
	e.addService(t, svcSetup{ServiceKey{vip4, 82, ProtoTCP}, Service{ID: 3}, nil}) // no backend: RST
	for _, tc := range []struct {
		name      string
		port      uint16
		verdict   Verdict
		hasReason bool
		reason    DropReason
	}{
		{"forwarded", 80, XDPTx, false, 0},
		{"no route", 81, XDPDrop, true, DropNoRoute},
		{"rejected with a reset", 82, XDPTx, true, DropRejected},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 40001, DstPort: tc.port}.Frame()
			var r TraceResult
			var err error
			e.ns.Do(t, func() { r, err = e.d.TraceResult(in, e.ifA) })
			if err != nil {
				t.Fatal(err)
			}
			if r.Verdict != tc.verdict || r.HasReason != tc.hasReason || (tc.hasReason && r.Reason != tc.reason) {
				t.Errorf("trace: verdict %v reason %v (%v), want %v %v (%v)", r.Verdict, r.Reason, r.HasReason, tc.verdict, tc.reason, tc.hasReason)
			}
		})
	}
}
