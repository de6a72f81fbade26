//go:build linux

package lbxdp

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/lbd-dev/lbd/internal/pktgen"
)

// TestMalformed: frames whose headers are truncated or inconsistent are
// dropped and counted, never forwarded.
func TestMalformed(t *testing.T) {
	e := encapEnv(t)
	tcp4 := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 7, DstPort: 80, Payload: pktgen.Bytes(20)}
	tcp6 := pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 7, DstPort: 81, Payload: pktgen.Bytes(20)}
	udp4, udp6 := tcp4, tcp6
	udp4.Proto, udp4.DstPort, udp6.Proto, udp6.DstPort = ProtoUDP, 53, ProtoUDP, 53
	hbh6 := pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 7, DstPort: 81, HopByHop: true}
	at4, at6 := pktgen.Locate(tcp4.Frame()), pktgen.Locate(tcp6.Frame())
	edit := func(p pktgen.Packet, f func(b []byte, at pktgen.Offsets)) []byte { return pktgen.Edit(p.Frame(), f) }
	put16 := binary.BigEndian.PutUint16
	udp6.NoUDPChecksum = true
	cases := []struct {
		name  string
		frame []byte
	}{
		{"ethernet only, ipv4 type", tcp4.Frame()[:at4.L3]},
		{"vlan tag cut", pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 7, DstPort: 80, VLAN: 3}.Frame()[:16]},
		{"ipv4 header cut", tcp4.Frame()[:at4.L3+12]},
		{"ipv4 version 5", edit(tcp4, func(b []byte, at pktgen.Offsets) { b[at.L3] = 0x55 })},
		{"ipv4 ihl 4", edit(tcp4, func(b []byte, at pktgen.Offsets) { b[at.L3] = 0x44 })},
		{"ipv4 total length beyond frame", edit(tcp4, func(b []byte, at pktgen.Offsets) { put16(b[at.L3+2:], 1500) })},
		{"ipv4 total length below header", edit(tcp4, func(b []byte, at pktgen.Offsets) { put16(b[at.L3+2:], 16) })},
		{"ipv4 ihl beyond total length", edit(tcp4, func(b []byte, at pktgen.Offsets) { b[at.L3] = 0x4f; put16(b[at.L3+2:], 40) })},
		{"tcp header cut", edit(tcp4, func(b []byte, at pktgen.Offsets) { put16(b[at.L3+2:], 32) })[:at4.L4+12]},
		{"tcp data offset 4", edit(tcp4, func(b []byte, at pktgen.Offsets) { b[at.L4+12] = 0x40 })},
		{"tcp data offset beyond packet", edit(tcp4, func(b []byte, at pktgen.Offsets) { b[at.L4+12] = 0xf0 })},
		{"udp length beyond packet", edit(udp4, func(b []byte, at pktgen.Offsets) { put16(b[at.L4+4:], 200) })},
		{"udp length below header", edit(udp4, func(b []byte, at pktgen.Offsets) { put16(b[at.L4+4:], 4) })},
		{"udp6 without checksum", udp6.Frame()},
		{"ipv6 header cut", tcp6.Frame()[:at6.L3+30]},
		{"ipv6 version 4", edit(tcp6, func(b []byte, at pktgen.Offsets) { b[at.L3] = 0x40 })},
		{"ipv6 payload beyond frame", edit(tcp6, func(b []byte, at pktgen.Offsets) { put16(b[at.L3+4:], 900) })},
		{"ipv6 hop-by-hop beyond payload", edit(hbh6, func(b []byte, at pktgen.Offsets) { b[at.L3+40+1] = 20 })},
		{"tcp6 header cut", edit(tcp6, func(b []byte, at pktgen.Offsets) { put16(b[at.L3+4:], 8) })[:at6.L4+8]},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.expectDrop(t, c.frame, DropMalformed)
		})
	}
}

// TestFragments: fragments of VIP traffic are dropped and counted (only the
// first carries ports, so later ones could not follow it); fragments of other
// traffic pass; an IPv6 atomic fragment is a whole packet (RFC 6946).
func TestFragments(t *testing.T) {
	e := encapEnv(t)
	frag := func(src, dst netip.Addr, dport, offset uint16, more bool) []byte {
		return pktgen.Packet{Src: src, Dst: dst, SrcPort: 9, DstPort: dport, Payload: pktgen.Bytes(16),
			Fragment: &pktgen.Fragment{Offset: offset, More: more}}.Frame()
	}
	drops := []struct {
		name  string
		frame []byte
	}{
		{"ipv4 first fragment", frag(client4, vip4, 80, 0, true)},
		{"ipv4 later fragment", frag(client4, vip4, 80, 16, false)},
		{"ipv4 last fragment", frag(client4, vip4, 80, 32, false)},
		{"ipv6 first fragment", frag(client6, vip6, 81, 0, true)},
		{"ipv6 later fragment", frag(client6, vip6, 81, 185, false)},
	}
	for _, c := range drops {
		t.Run(c.name, func(t *testing.T) { e.expectDrop(t, c.frame, DropFragment) })
	}
	t.Run("ipv4 fragment of other traffic passes", func(t *testing.T) {
		if v, _ := e.run(t, frag(client4, client4, 80, 0, true)); v != XDPPass {
			t.Errorf("verdict %v", v)
		}
	})
	t.Run("ipv6 fragment of other traffic passes", func(t *testing.T) {
		if v, _ := e.run(t, frag(client6, client6, 81, 3, true)); v != XDPPass {
			t.Errorf("verdict %v", v)
		}
	})
	t.Run("ipv6 atomic fragment is forwarded", func(t *testing.T) {
		v, out := e.run(t, frag(client6, vip6, 81, 0, false))
		if v != XDPTx {
			t.Fatalf("verdict %v", v)
		}
		if got := backendOf(t, out); got.String() != "2001:db8:20::5" {
			t.Errorf("went to %v", got)
		}
	})
}

// TestFIBFailure: no route (or an unreachable one) toward the backend's node drops
// and counts as fib_no_route, never XDP_PASS of the VIP packet, which would loop
// through the router. (An unresolved neighbour is not a failure: route_test.go.)
func TestFIBFailure(t *testing.T) {
	e := newEnv(t)
	e.addBackend(t, 2, "198.18.20.2", 8080, "198.18.14.2") // unreachable route
	e.addBackend(t, 3, "198.18.20.3", 8080, "198.19.99.3") // no route at all
	e.addBackend(t, 4, "198.18.20.4", 8080, "2001:db8:99::4")
	for i := uint32(2); i <= 4; i++ {
		e.addService(t, svcSetup{ServiceKey{vip4, uint16(80 + i), ProtoTCP}, Service{ID: i}, []uint32{i}})
	}
	for i := uint32(2); i <= 4; i++ {
		e.expectDrop(t, pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1, DstPort: uint16(80 + i)}.Frame(), DropNoRoute)
	}
}

// TestFIBSource: without a configured outer source the FIB's preferred
// source address is used.
func TestFIBSource(t *testing.T) {
	e := newEnv(t)
	if err := e.d.SetConfig(DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	e.addBackend(t, 1, "198.18.20.1", 8080, "198.18.11.1")
	e.addBackend(t, 2, "2001:db8:20::2", 8080, "2001:db8:11::2")
	e.addService(t, svcSetup{ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1}, []uint32{1}})
	e.addService(t, svcSetup{ServiceKey{vip6, 80, ProtoTCP}, Service{ID: 2}, []uint32{2}})
	v, out := e.run(t, pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1, DstPort: 80}.Frame())
	if v != XDPRedirect {
		t.Fatalf("verdict %v", v)
	}
	if src := pktgen.DecodeGeneve(t, out).Src(); src.String() != "198.18.1.1" {
		t.Errorf("outer source %v, want lbC's 198.18.1.1", src)
	}
	v, out = e.run(t, pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 1, DstPort: 80}.Frame())
	if v != XDPRedirect {
		t.Fatalf("verdict %v", v)
	}
	if src := pktgen.DecodeGeneve(t, out).Src(); src.String() != "2001:db8:1::1" {
		t.Errorf("outer source %v, want lbC's 2001:db8:1::1", src)
	}
}

// TestRouteCache: FIB results are cached per backend; FlushRouteCache makes a
// neighbour or route change take effect at once.
func TestRouteCache(t *testing.T) {
	e := newEnv(t)
	e.addBackend(t, 1, "198.18.20.1", 8080, "198.18.10.1")
	e.addService(t, svcSetup{ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1}, []uint32{1}})
	frame := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1, DstPort: 80}.Frame()
	_, out := e.run(t, frame)
	if d := pktgen.DecodeGeneve(t, out); d.Eth.DstMAC.String() != nhMAC.String() {
		t.Fatalf("next hop %v", d.Eth.DstMAC)
	}
	routes, err := e.d.CachedRoutes(1)
	if err != nil || len(routes) != 1 || routes[0].DstMAC.String() != nhMAC.String() || routes[0].Egress != e.ifA ||
		routes[0].Node.String() != "198.18.10.1" || routes[0].Source != src4 || routes[0].MTU != 1500 || routes[0].Stale {
		t.Fatalf("cached routes %+v (%v)", routes, err)
	}

	newMAC := "02:00:00:00:00:22"
	e.ns.IP(t, "neigh replace 198.18.0.2 lladdr "+newMAC+" dev "+e.devA+" nud permanent")
	if err := e.d.FlushRouteCache(); err != nil {
		t.Fatal(err)
	}
	if routes, _ := e.d.CachedRoutes(1); len(routes) != 1 || !routes[0].Stale {
		t.Errorf("after flush: %+v", routes)
	}
	_, out = e.run(t, frame)
	if d := pktgen.DecodeGeneve(t, out); d.Eth.DstMAC.String() != newMAC {
		t.Errorf("after a neighbour change and a flush: next hop %v, want %s", d.Eth.DstMAC, newMAC)
	}

	e.ns.IP(t, "route del 198.18.10.0/24")
	if err := e.d.FlushRouteCache(); err != nil {
		t.Fatal(err)
	}
	e.expectDrop(t, frame, DropNoRoute)
}
