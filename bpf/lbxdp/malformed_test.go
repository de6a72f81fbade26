//go:build linux

package lbxdp

import (
	"encoding/binary"
	"testing"
)

// TestMalformed: frames whose headers are truncated or inconsistent are
// dropped and counted, never forwarded.
func TestMalformed(t *testing.T) {
	e := encapEnv(t)
	tcp4 := func() []byte { return pkt{src: client4, dst: vip4, sport: 7, dport: 80, payload: 20}.build(t) }
	tcp6 := func() []byte { return pkt{src: client6, dst: vip6, sport: 7, dport: 81, payload: 20}.build(t) }
	udp4 := func() []byte {
		return pkt{src: client4, dst: vip4, sport: 7, dport: 53, proto: ProtoUDP, payload: 20}.build(t)
	}
	udp6 := func() []byte {
		return pkt{src: client6, dst: vip6, sport: 7, dport: 53, proto: ProtoUDP, payload: 20}.build(t)
	}
	mod := func(b []byte, f func([]byte)) []byte { f(b); return b }
	cases := []struct {
		name  string
		frame []byte
	}{
		{"ethernet only, ipv4 type", mod(tcp4()[:14], func([]byte) {})},
		{"vlan tag cut", mod(pkt{src: client4, dst: vip4, sport: 7, dport: 80, vlan: 3}.build(t)[:16], func([]byte) {})},
		{"ipv4 header cut", tcp4()[:14+12]},
		{"ipv4 version 5", mod(tcp4(), func(b []byte) { b[14] = 0x55 })},
		{"ipv4 ihl 4", mod(tcp4(), func(b []byte) { b[14] = 0x44 })},
		{"ipv4 total length beyond frame", mod(tcp4(), func(b []byte) { binary.BigEndian.PutUint16(b[16:], 1500) })},
		{"ipv4 total length below header", mod(tcp4(), func(b []byte) { binary.BigEndian.PutUint16(b[16:], 16) })},
		{"ipv4 ihl beyond total length", mod(tcp4(), func(b []byte) { b[14] = 0x4f; binary.BigEndian.PutUint16(b[16:], 40) })},
		{"tcp header cut", mod(tcp4()[:14+20+12], func(b []byte) { binary.BigEndian.PutUint16(b[16:], 32) })},
		{"tcp data offset 4", mod(tcp4(), func(b []byte) { b[14+20+12] = 0x40 })},
		{"tcp data offset beyond packet", mod(tcp4(), func(b []byte) { b[14+20+12] = 0xf0 })},
		{"udp length beyond packet", mod(udp4(), func(b []byte) { binary.BigEndian.PutUint16(b[14+20+4:], 200) })},
		{"udp length below header", mod(udp4(), func(b []byte) { binary.BigEndian.PutUint16(b[14+20+4:], 4) })},
		{"udp6 without checksum", mod(udp6(), func(b []byte) { b[14+40+6], b[14+40+7] = 0, 0 })},
		{"ipv6 header cut", tcp6()[:14+30]},
		{"ipv6 version 4", mod(tcp6(), func(b []byte) { b[14] = 0x40 })},
		{"ipv6 payload beyond frame", mod(tcp6(), func(b []byte) { binary.BigEndian.PutUint16(b[18:], 900) })},
		{"ipv6 hop-by-hop beyond payload", mod(pkt{src: client6, dst: vip6, sport: 7, dport: 81, extHdr: true}.build(t), func(b []byte) { b[14+41] = 20 })},
		{"tcp6 header cut", mod(tcp6()[:14+40+8], func(b []byte) { binary.BigEndian.PutUint16(b[18:], 8) })},
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
	frag6 := func(dst bool, offset uint16, more bool) []byte {
		b := pkt{src: client6, dst: vip6, sport: 9, dport: 81, payload: 16}.build(t)
		if !dst {
			copy(b[14+24:], client6.AsSlice())
		}
		fo := offset << 3
		if more {
			fo |= 1
		}
		fh := []byte{b[14+6], 0, byte(fo >> 8), byte(fo), 0, 0, 0, 1}
		b[14+6] = 44
		binary.BigEndian.PutUint16(b[14+4:], binary.BigEndian.Uint16(b[14+4:])+8)
		return append(b[:14+40], append(fh, b[14+40:]...)...)
	}
	frag4 := func(flags uint16, vip bool) []byte {
		b := pkt{src: client4, dst: vip4, sport: 9, dport: 80, payload: 16}.build(t)
		if !vip {
			copy(b[14+16:], client4.AsSlice())
		}
		binary.BigEndian.PutUint16(b[14+6:], flags)
		return b
	}
	drops := []struct {
		name  string
		frame []byte
	}{
		{"ipv4 first fragment", frag4(0x2000, true)},
		{"ipv4 later fragment", frag4(0x0010, true)},
		{"ipv4 last fragment", frag4(0x0020, true)},
		{"ipv6 first fragment", frag6(true, 0, true)},
		{"ipv6 later fragment", frag6(true, 185, false)},
	}
	for _, c := range drops {
		t.Run(c.name, func(t *testing.T) { e.expectDrop(t, c.frame, DropFragment) })
	}
	t.Run("ipv4 fragment of other traffic passes", func(t *testing.T) {
		if v, _ := e.run(t, frag4(0x2000, false)); v != XDPPass {
			t.Errorf("verdict %v", v)
		}
	})
	t.Run("ipv6 fragment of other traffic passes", func(t *testing.T) {
		if v, _ := e.run(t, frag6(false, 3, true)); v != XDPPass {
			t.Errorf("verdict %v", v)
		}
	})
	t.Run("ipv6 atomic fragment is forwarded", func(t *testing.T) {
		v, out := e.run(t, frag6(true, 0, false))
		if v != XDPTx {
			t.Fatalf("verdict %v", v)
		}
		if d := decodeEncap(t, out); innerDst(d).String() != "2001:db8:20::5" {
			t.Errorf("went to %v", innerDst(d))
		}
	})
}

// TestFIBFailure: no usable route or neighbour toward the backend's node
// drops and counts (never XDP_PASS, which would loop through the router).
func TestFIBFailure(t *testing.T) {
	e := newEnv(t)
	e.addBackend(t, 1, "198.18.20.1", 8080, "198.18.13.1") // neighbour missing
	e.addBackend(t, 2, "198.18.20.2", 8080, "198.18.14.2") // unreachable route
	e.addBackend(t, 3, "198.18.20.3", 8080, "198.19.99.3") // no route at all
	e.addBackend(t, 4, "198.18.20.4", 8080, "2001:db8:99::4")
	for i := uint32(1); i <= 4; i++ {
		e.addService(t, svcSetup{ServiceKey{vip4, uint16(80 + i), ProtoTCP}, Service{ID: i}, []uint32{i}})
	}
	for i := uint32(1); i <= 4; i++ {
		e.expectDrop(t, pkt{src: client4, dst: vip4, sport: 1, dport: uint16(80 + i)}.build(t), DropFIB)
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
	v, out := e.run(t, pkt{src: client4, dst: vip4, sport: 1, dport: 80}.build(t))
	if v != XDPRedirect {
		t.Fatalf("verdict %v", v)
	}
	if d := decodeEncap(t, out); addrOf(d.outer4.SrcIP).String() != "198.18.1.1" {
		t.Errorf("outer source %v, want lbC's 198.18.1.1", d.outer4.SrcIP)
	}
	v, out = e.run(t, pkt{src: client6, dst: vip6, sport: 1, dport: 80}.build(t))
	if v != XDPRedirect {
		t.Fatalf("verdict %v", v)
	}
	if d := decodeEncap(t, out); addrOf(d.outer6.SrcIP).String() != "2001:db8:1::1" {
		t.Errorf("outer source %v, want lbC's 2001:db8:1::1", d.outer6.SrcIP)
	}
}

// TestRouteCache: FIB results are cached per backend; FlushRouteCache makes a
// neighbour or route change take effect at once.
func TestRouteCache(t *testing.T) {
	e := newEnv(t)
	e.addBackend(t, 1, "198.18.20.1", 8080, "198.18.10.1")
	e.addService(t, svcSetup{ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1}, []uint32{1}})
	frame := pkt{src: client4, dst: vip4, sport: 1, dport: 80}.build(t)
	_, out := e.run(t, frame)
	if d := decodeEncap(t, out); d.outerEth.DstMAC.String() != nhMAC.String() {
		t.Fatalf("next hop %v", d.outerEth.DstMAC)
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
	if d := decodeEncap(t, out); d.outerEth.DstMAC.String() != newMAC {
		t.Errorf("after a neighbour change and a flush: next hop %v, want %s", d.outerEth.DstMAC, newMAC)
	}

	e.ns.IP(t, "route del 198.18.10.0/24")
	if err := e.d.FlushRouteCache(); err != nil {
		t.Fatal(err)
	}
	e.expectDrop(t, frame, DropFIB)
}
