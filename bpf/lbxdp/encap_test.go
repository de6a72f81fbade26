//go:build linux

package lbxdp

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket/layers"
)

// encapEnv programs one service per underlay/VIP combination, each with a
// single backend so the expected backend is known.
func encapEnv(t testing.TB) *env {
	t.Helper()
	e := newEnv(t)
	e.addBackend(t, 1, "198.18.20.1", 8080, "198.18.10.1")
	e.addBackend(t, 2, "198.18.20.2", 8080, "198.18.11.2")
	e.addBackend(t, 3, "198.18.20.3", 8080, "2001:db8:10::3")
	e.addBackend(t, 4, "2001:db8:20::4", 8443, "198.18.10.4")
	e.addBackend(t, 5, "2001:db8:20::5", 8443, "2001:db8:10::5")
	e.addBackend(t, 6, "198.18.20.6", 0, "198.18.10.6")
	e.addBackend(t, 7, "2001:db8:20::7", 8443, "2001:db8:11::7")
	for _, s := range []svcSetup{
		{ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1}, []uint32{1}},
		{ServiceKey{vip4, 53, ProtoUDP}, Service{ID: 2}, []uint32{1}},
		{ServiceKey{vip4, 81, ProtoTCP}, Service{ID: 3}, []uint32{2}},
		{ServiceKey{vip4, 82, ProtoTCP}, Service{ID: 4}, []uint32{3}},
		{ServiceKey{vip4, 83, ProtoUDP}, Service{ID: 5}, []uint32{3}},
		{ServiceKey{vip6, 80, ProtoTCP}, Service{ID: 6}, []uint32{4}},
		{ServiceKey{vip6, 81, ProtoTCP}, Service{ID: 7}, []uint32{5}},
		{ServiceKey{vip6, 53, ProtoUDP}, Service{ID: 8}, []uint32{5}},
		{ServiceKey{vip4b, 0, ProtoTCP}, Service{ID: 9}, []uint32{6}},
		{ServiceKey{vip6, 82, ProtoTCP}, Service{ID: 10}, []uint32{7}},
	} {
		e.addService(t, s)
	}
	return e
}

type encapWant struct {
	verdict  Verdict
	node     string // outer destination
	backend  string // inner destination
	bport    uint16 // inner destination port
	dmac     net.HardwareAddr
	viaC     bool // egress is lbC
	noUDPSum bool // outer UDP checksum must be 0 even over IPv6
}

func TestEncap(t *testing.T) {
	e := encapEnv(t)
	cases := []struct {
		name string
		in   pkt
		want encapWant
	}{
		{"tcp4 over ipv4", pkt{src: client4, dst: vip4, sport: 40000, dport: 80, payload: 100}, encapWant{XDPTx, "198.18.10.1", "198.18.20.1", 8080, nhMAC, false, false}},
		{"udp4 over ipv4", pkt{src: client4, dst: vip4, sport: 40001, dport: 53, proto: ProtoUDP, payload: 60}, encapWant{XDPTx, "198.18.10.1", "198.18.20.1", 8080, nhMAC, false, false}},
		{"tcp4 redirect to other port", pkt{src: client4, dst: vip4, sport: 40002, dport: 81, payload: 10}, encapWant{XDPRedirect, "198.18.11.2", "198.18.20.2", 8080, nh2MAC, true, false}},
		{"tcp4 over ipv6", pkt{src: client4, dst: vip4, sport: 40003, dport: 82, payload: 333}, encapWant{XDPTx, "2001:db8:10::3", "198.18.20.3", 8080, nhMAC, false, false}},
		{"udp4 over ipv6", pkt{src: client4, dst: vip4, sport: 40004, dport: 83, proto: ProtoUDP, payload: 77}, encapWant{XDPTx, "2001:db8:10::3", "198.18.20.3", 8080, nhMAC, false, false}},
		{"udp4 no checksum over ipv4", pkt{src: client4, dst: vip4, sport: 40005, dport: 53, proto: ProtoUDP, payload: 20, udpNoCsum: true}, encapWant{XDPTx, "198.18.10.1", "198.18.20.1", 8080, nhMAC, false, false}},
		{"udp4 no checksum over ipv6", pkt{src: client4, dst: vip4, sport: 40006, dport: 83, proto: ProtoUDP, payload: 20, udpNoCsum: true}, encapWant{XDPTx, "2001:db8:10::3", "198.18.20.3", 8080, nhMAC, false, true}},
		{"tcp6 over ipv4", pkt{src: client6, dst: vip6, sport: 40007, dport: 80, payload: 64}, encapWant{XDPTx, "198.18.10.4", "2001:db8:20::4", 8443, nhMAC, false, false}},
		{"tcp6 over ipv6", pkt{src: client6, dst: vip6, sport: 40008, dport: 81, payload: 64}, encapWant{XDPTx, "2001:db8:10::5", "2001:db8:20::5", 8443, nhMAC, false, false}},
		{"udp6 over ipv6", pkt{src: client6, dst: vip6, sport: 40009, dport: 53, proto: ProtoUDP, payload: 99}, encapWant{XDPTx, "2001:db8:10::5", "2001:db8:20::5", 8443, nhMAC, false, false}},
		{"tcp6 hop-by-hop over ipv6", pkt{src: client6, dst: vip6, sport: 40010, dport: 81, payload: 31, extHdr: true}, encapWant{XDPTx, "2001:db8:10::5", "2001:db8:20::5", 8443, nhMAC, false, false}},
		{"tcp6 redirect over ipv6", pkt{src: client6, dst: vip6, sport: 40011, dport: 82, payload: 5}, encapWant{XDPRedirect, "2001:db8:11::7", "2001:db8:20::7", 8443, nh2MAC, true, false}},
		{"tcp4 with ip options", pkt{src: client4, dst: vip4, sport: 40012, dport: 80, payload: 40, ipOptions: true}, encapWant{XDPTx, "198.18.10.1", "198.18.20.1", 8080, nhMAC, false, false}},
		{"tcp4 vlan tagged", pkt{src: client4, dst: vip4, sport: 40013, dport: 80, payload: 40, vlan: 42}, encapWant{XDPTx, "198.18.10.1", "198.18.20.1", 8080, nhMAC, false, false}},
		{"udp6 vlan tagged", pkt{src: client6, dst: vip6, sport: 40014, dport: 53, proto: ProtoUDP, payload: 8, vlan: 7}, encapWant{XDPTx, "2001:db8:10::5", "2001:db8:20::5", 8443, nhMAC, false, false}},
		{"ethernet padding trimmed", pkt{src: client4, dst: vip4, sport: 40015, dport: 80, tcpFlags: tcpACK, pad: 6}, encapWant{XDPTx, "198.18.10.1", "198.18.20.1", 8080, nhMAC, false, false}},
		{"wildcard service keeps port", pkt{src: client4, dst: vip4b, sport: 40016, dport: 4433, payload: 12}, encapWant{XDPTx, "198.18.10.6", "198.18.20.6", 4433, nhMAC, false, false}},
		{"mid-flow ack", pkt{src: client4, dst: vip4, sport: 40017, dport: 80, tcpFlags: tcpACK | tcpPSH, payload: 1200}, encapWant{XDPTx, "198.18.10.1", "198.18.20.1", 8080, nhMAC, false, false}},
		{"tcp4 ipv4 df kept inside", pkt{src: client4, dst: vip4, sport: 40018, dport: 82, payload: 1, df: true}, encapWant{XDPTx, "2001:db8:10::3", "198.18.20.3", 8080, nhMAC, false, false}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := c.in.build(t)
			v, out := e.run(t, in)
			if v != c.want.verdict {
				t.Fatalf("verdict %v, want %v", v, c.want.verdict)
			}
			checkEncap(t, e, c.in, in, out, c.want)
		})
	}
}

// checkEncap verifies every outer header field, the Geneve option, the inner
// DNAT and all checksums (recomputed here, independently of the program).
func checkEncap(t *testing.T, e *env, p pkt, in, out []byte, w encapWant) {
	t.Helper()
	d := decodeEncap(t, out)
	node := netip.MustParseAddr(w.node)
	backend := netip.MustParseAddr(w.backend)
	srcMAC := e.macA
	if w.viaC {
		srcMAC = e.macC
	}
	l3in := 14
	if p.vlan != 0 {
		l3in = 18
	}
	innerIn := in[l3in : l3in+ipLen(in[l3in:])]
	vipIs4 := p.dst.Is4()
	optLen := 12
	if !vipIs4 {
		optLen = 24
	}
	outerIPLen := 20
	if node.Is6() {
		outerIPLen = 40
	}
	if want := 14 + outerIPLen + 8 + 8 + optLen + 14 + len(innerIn); len(out) != want {
		t.Fatalf("output %d bytes, want %d", len(out), want)
	}
	if node.Is4() && vipIs4 && len(out)-(14+len(innerIn)) != 62 {
		t.Fatalf("IPv4/IPv4 overhead is not 62 bytes")
	}

	if !bytes.Equal(d.outerEth.DstMAC, w.dmac) || !bytes.Equal(d.outerEth.SrcMAC, srcMAC) {
		t.Errorf("outer MACs %v -> %v, want %v -> %v", d.outerEth.SrcMAC, d.outerEth.DstMAC, srcMAC, w.dmac)
	}
	udpBytes := out[14+outerIPLen:]
	if node.Is4() {
		ip := d.outer4
		if ip == nil {
			t.Fatal("outer header is not IPv4")
		}
		if d.outerEth.EthernetType != layers.EthernetTypeIPv4 || ip.IHL != 5 || ip.TTL != 64 || ip.Flags != layers.IPv4DontFragment ||
			ip.Protocol != layers.IPProtocolUDP || ip.TOS != 0x28 || int(ip.Length) != len(out)-14 {
			t.Errorf("outer IPv4 header: %+v", ip)
		}
		if addrOf(ip.SrcIP) != src4 || addrOf(ip.DstIP) != node {
			t.Errorf("outer IPv4 %v -> %v, want %v -> %v", ip.SrcIP, ip.DstIP, src4, node)
		}
		if !ipv4HeaderOK(out[14:34]) {
			t.Error("outer IPv4 checksum does not verify")
		}
		if d.udp.Checksum != 0 {
			t.Errorf("outer UDP checksum %#x over IPv4, want 0", d.udp.Checksum)
		}
	} else {
		ip := d.outer6
		if ip == nil {
			t.Fatal("outer header is not IPv6")
		}
		if d.outerEth.EthernetType != layers.EthernetTypeIPv6 || ip.HopLimit != 64 || ip.NextHeader != layers.IPProtocolUDP ||
			ip.TrafficClass != 0x28 || int(ip.Length) != len(out)-54 || ip.FlowLabel == 0 {
			t.Errorf("outer IPv6 header: %+v", ip)
		}
		if addrOf(ip.SrcIP) != src6 || addrOf(ip.DstIP) != node {
			t.Errorf("outer IPv6 %v -> %v, want %v -> %v", ip.SrcIP, ip.DstIP, src6, node)
		}
		if w.noUDPSum {
			if d.udp.Checksum != 0 {
				t.Errorf("outer UDP checksum %#x, want 0 (inner UDP has none)", d.udp.Checksum)
			}
		} else if !l4SumOK(src6, node, 17, udpBytes) {
			t.Error("outer UDP checksum over IPv6 does not verify")
		}
	}
	if d.udp.DstPort != 6081 || d.udp.SrcPort < 32768 || int(d.udp.Length) != len(udpBytes) {
		t.Errorf("outer UDP %d -> %d len %d", d.udp.SrcPort, d.udp.DstPort, d.udp.Length)
	}

	// Geneve header and DSR option, byte by byte (DESIGN.md §2).
	g := udpBytes[8:]
	wantGeneve := []byte{byte(optLen / 4), 0x40, 0x65, 0x58, 0, 0, 2, 0}
	if !bytes.Equal(g[:8], wantGeneve) {
		t.Errorf("geneve header % x, want % x", g[:8], wantGeneve)
	}
	opt := g[8 : 8+optLen]
	if binary.BigEndian.Uint16(opt) != 0x014B || opt[2] != 0x81 || int(opt[3]&0x1f) != optLen/4-1 || opt[3]&0xe0 != 0 {
		t.Errorf("option header % x", opt[:4])
	}
	if got := addrFromBytes(opt[4 : 4+len(p.dst.AsSlice())]); got != p.dst {
		t.Errorf("option VIP %v, want %v", got, p.dst)
	}
	rest := opt[4+len(p.dst.AsSlice()):]
	if binary.BigEndian.Uint16(rest) != p.dport || rest[2] != 0 || rest[3] != 0 {
		t.Errorf("option port/pad % x, want port %d then 0 0", rest, p.dport)
	}
	if d.geneve.VNI != 2 || d.geneve.Protocol != layers.EthernetTypeTransparentEthernetBridging || len(d.geneve.Options) != 1 || !d.geneve.CriticalOption {
		t.Errorf("gopacket's view of geneve: %+v", d.geneve)
	}

	// Inner frame.
	if !bytes.Equal(d.innerEth.DstMAC, w.dmac) || !bytes.Equal(d.innerEth.SrcMAC, srcMAC) {
		t.Errorf("inner MACs %v -> %v", d.innerEth.SrcMAC, d.innerEth.DstMAC)
	}
	innerOut := out[len(out)-len(innerIn):]
	if len(innerOut) != len(innerIn) {
		t.Fatalf("inner packet %d bytes, want %d", len(innerOut), len(innerIn))
	}
	var l4in, l4out []byte
	if vipIs4 {
		ip := d.inner4
		if ip == nil || d.innerEth.EthernetType != layers.EthernetTypeIPv4 {
			t.Fatal("inner packet is not IPv4")
		}
		ihl := int(ip.IHL) * 4
		if addrOf(ip.DstIP) != backend || addrOf(ip.SrcIP) != p.src || ip.TTL != 60 || ip.Id != 0x1234 {
			t.Errorf("inner IPv4 %v -> %v ttl %d", ip.SrcIP, ip.DstIP, ip.TTL)
		}
		if !ipv4HeaderOK(innerOut[:ihl]) {
			t.Error("inner IPv4 checksum does not verify")
		}
		if !bytes.Equal(innerOut[12:16], innerIn[12:16]) || !bytes.Equal(innerOut[20:ihl], innerIn[20:ihl]) {
			t.Error("inner IPv4 header changed beyond the destination")
		}
		l4in, l4out = innerIn[ihl:], innerOut[ihl:]
	} else {
		ip := d.inner6
		if ip == nil || d.innerEth.EthernetType != layers.EthernetTypeIPv6 {
			t.Fatal("inner packet is not IPv6")
		}
		if addrOf(ip.DstIP) != backend || addrOf(ip.SrcIP) != p.src || ip.HopLimit != 60 {
			t.Errorf("inner IPv6 %v -> %v", ip.SrcIP, ip.DstIP)
		}
		off := 40
		if p.extHdr {
			off += 8
		}
		if !bytes.Equal(innerOut[:24], innerIn[:24]) || !bytes.Equal(innerOut[40:off], innerIn[40:off]) {
			t.Error("inner IPv6 header changed beyond the destination")
		}
		l4in, l4out = innerIn[off:], innerOut[off:]
	}
	if binary.BigEndian.Uint16(l4out[2:]) != w.bport || !bytes.Equal(l4out[:2], l4in[:2]) {
		t.Errorf("inner ports %d -> %d, want %d -> %d", binary.BigEndian.Uint16(l4out), binary.BigEndian.Uint16(l4out[2:]), p.sport, w.bport)
	}
	sumOff := 16
	proto := ProtoTCP
	if p.proto == ProtoUDP {
		sumOff, proto = 6, ProtoUDP
	}
	if !bytes.Equal(l4out[4:sumOff], l4in[4:sumOff]) || !bytes.Equal(l4out[sumOff+2:], l4in[sumOff+2:]) {
		t.Error("inner transport header or payload changed beyond port and checksum")
	}
	if p.udpNoCsum {
		if l4out[6] != 0 || l4out[7] != 0 {
			t.Errorf("inner UDP checksum % x, want it left at 0", l4out[6:8])
		}
	} else if !l4SumOK(p.src, backend, proto, l4out) {
		t.Error("inner transport checksum does not verify")
	}
}

// ipLen is the length of the IP packet at the start of b, from its header.
func ipLen(b []byte) int {
	if b[0]>>4 == 4 {
		return int(binary.BigEndian.Uint16(b[2:]))
	}
	return 40 + int(binary.BigEndian.Uint16(b[4:]))
}

func addrFromBytes(b []byte) netip.Addr {
	a, _ := netip.AddrFromSlice(b)
	return a
}

// TestEncapSourcePortSpread checks that the outer UDP source port follows the
// flow: the same flow keeps its port, and different flows spread over the
// 32768-65535 range.
func TestEncapSourcePortSpread(t *testing.T) {
	e := encapEnv(t)
	ports := map[layers.UDPPort]bool{}
	for i := range 64 {
		in := pkt{src: client4, dst: vip4, sport: uint16(20000 + i), dport: 80}.build(t)
		_, out1 := e.run(t, in)
		_, out2 := e.run(t, pkt{src: client4, dst: vip4, sport: uint16(20000 + i), dport: 80, tcpFlags: tcpACK}.build(t))
		p1, p2 := decodeEncap(t, out1).udp.SrcPort, decodeEncap(t, out2).udp.SrcPort
		if p1 != p2 {
			t.Fatalf("flow %d: source port changed %d -> %d", i, p1, p2)
		}
		if p1 < 32768 {
			t.Fatalf("source port %d below 32768", p1)
		}
		ports[p1] = true
	}
	if len(ports) < 60 {
		t.Errorf("64 flows used only %d distinct source ports", len(ports))
	}
}
