//go:build linux

package lbxdp

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket/layers"
	"github.com/lbd-dev/lbd/internal/pktgen"
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
	e.addBackend(t, 8, "198.18.20.8", 36412, "198.18.10.8")
	e.addBackend(t, 9, "2001:db8:20::9", 36412, "2001:db8:10::9")
	e.addBackend(t, 10, "198.18.20.10", 0, "2001:db8:10::10")
	e.addBackend(t, 11, "198.18.20.11", 53, "198.18.10.11")
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
		{ServiceKey{vip4, 36412, ProtoSCTP}, Service{ID: 11}, []uint32{8}},
		{ServiceKey{vip6, 36412, ProtoSCTP}, Service{ID: 12}, []uint32{9}},
		{ServiceKey{vip4c, 0, ProtoSCTP}, Service{ID: 13}, []uint32{10}},
		// The port of the UDP service 2, SCTP's: another service.
		{ServiceKey{vip4, 53, ProtoSCTP}, Service{ID: 14}, []uint32{11}},
	} {
		e.addService(t, s)
	}
	return e
}

// nops are IPv4 options: three NOPs (the builder ends them).
var nops = []byte{1, 1, 1}

// encapCase is a client packet in, the verdict, and the packet out: in wrapped for
// node (XDP_TX leaves by lbA, XDP_REDIRECT by lbC) and DNAT'ed to backend:bport.
func encapCase(name string, in pktgen.Packet, v Verdict, node, backend string, bport uint16) pktgen.Case[caseEnv, Verdict] {
	return pktgen.Case[caseEnv, Verdict]{Name: name, In: in.Frame(), Verdict: v, Check: func(t *testing.T, e caseEnv, _, out []byte) {
		checkEncap(t, e.env, in, out, v == XDPRedirect, netip.MustParseAddr(node), netip.AddrPortFrom(netip.MustParseAddr(backend), bport))
	}}
}

func TestEncap(t *testing.T) {
	e := encapEnv(t)
	e.runCases(t, []pktgen.Case[caseEnv, Verdict]{
		encapCase("tcp4 over ipv4", pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 40000, DstPort: 80, Payload: pktgen.Bytes(100)},
			XDPTx, "198.18.10.1", "198.18.20.1", 8080),
		encapCase("udp4 over ipv4", pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 40001, DstPort: 53, Proto: ProtoUDP, Payload: pktgen.Bytes(60)},
			XDPTx, "198.18.10.1", "198.18.20.1", 8080),
		encapCase("tcp4 redirect to other port", pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 40002, DstPort: 81, Payload: pktgen.Bytes(10)},
			XDPRedirect, "198.18.11.2", "198.18.20.2", 8080),
		encapCase("tcp4 over ipv6", pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 40003, DstPort: 82, Payload: pktgen.Bytes(333)},
			XDPTx, "2001:db8:10::3", "198.18.20.3", 8080),
		encapCase("udp4 over ipv6", pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 40004, DstPort: 83, Proto: ProtoUDP, Payload: pktgen.Bytes(77)},
			XDPTx, "2001:db8:10::3", "198.18.20.3", 8080),
		encapCase("udp4 no checksum over ipv4", pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 40005, DstPort: 53, Proto: ProtoUDP, Payload: pktgen.Bytes(20), NoUDPChecksum: true},
			XDPTx, "198.18.10.1", "198.18.20.1", 8080),
		encapCase("udp4 no checksum over ipv6", pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 40006, DstPort: 83, Proto: ProtoUDP, Payload: pktgen.Bytes(20), NoUDPChecksum: true},
			XDPTx, "2001:db8:10::3", "198.18.20.3", 8080),
		encapCase("tcp6 over ipv4", pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 40007, DstPort: 80, Payload: pktgen.Bytes(64)},
			XDPTx, "198.18.10.4", "2001:db8:20::4", 8443),
		encapCase("tcp6 over ipv6", pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 40008, DstPort: 81, Payload: pktgen.Bytes(64)},
			XDPTx, "2001:db8:10::5", "2001:db8:20::5", 8443),
		encapCase("udp6 over ipv6", pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 40009, DstPort: 53, Proto: ProtoUDP, Payload: pktgen.Bytes(99)},
			XDPTx, "2001:db8:10::5", "2001:db8:20::5", 8443),
		encapCase("tcp6 hop-by-hop over ipv6", pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 40010, DstPort: 81, Payload: pktgen.Bytes(31), HopByHop: true},
			XDPTx, "2001:db8:10::5", "2001:db8:20::5", 8443),
		encapCase("tcp6 redirect over ipv6", pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 40011, DstPort: 82, Payload: pktgen.Bytes(5)},
			XDPRedirect, "2001:db8:11::7", "2001:db8:20::7", 8443),
		encapCase("tcp4 with ip options", pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 40012, DstPort: 80, Payload: pktgen.Bytes(40), IPOptions: nops},
			XDPTx, "198.18.10.1", "198.18.20.1", 8080),
		encapCase("tcp4 vlan tagged", pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 40013, DstPort: 80, Payload: pktgen.Bytes(40), VLAN: 42},
			XDPTx, "198.18.10.1", "198.18.20.1", 8080),
		encapCase("udp6 vlan tagged", pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 40014, DstPort: 53, Proto: ProtoUDP, Payload: pktgen.Bytes(8), VLAN: 7},
			XDPTx, "2001:db8:10::5", "2001:db8:20::5", 8443),
		encapCase("ethernet padding trimmed", pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 40015, DstPort: 80, Flags: pktgen.ACK, Pad: 6},
			XDPTx, "198.18.10.1", "198.18.20.1", 8080),
		encapCase("wildcard service keeps port", pktgen.Packet{Src: client4, Dst: vip4b, SrcPort: 40016, DstPort: 4433, Payload: pktgen.Bytes(12)},
			XDPTx, "198.18.10.6", "198.18.20.6", 4433),
		encapCase("mid-flow ack", pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 40017, DstPort: 80, Flags: pktgen.ACK | pktgen.PSH, Payload: pktgen.Bytes(1200)},
			XDPTx, "198.18.10.1", "198.18.20.1", 8080),
		encapCase("tcp4 ipv4 df kept inside", pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 40018, DstPort: 82, Payload: pktgen.Bytes(1), DF: true},
			XDPTx, "2001:db8:10::3", "198.18.20.3", 8080),
		// SCTP: the address changes, the port and so the CRC32c do not.
		encapCase("sctp4 init over ipv4", sctpPacket(client4, vip4, 40019, 36412, pktgen.SCTPInit),
			XDPTx, "198.18.10.8", "198.18.20.8", 36412),
		encapCase("sctp6 data over ipv6", sctpPacket(client6, vip6, 40020, 36412, pktgen.SCTPData),
			XDPTx, "2001:db8:10::9", "2001:db8:20::9", 36412),
		encapCase("sctp4 all ports over ipv6", sctpPacket(client4, vip4c, 40021, 3868, pktgen.SCTPInit),
			XDPTx, "2001:db8:10::10", "198.18.20.10", 3868),
		encapCase("sctp4 on a udp service's port", sctpPacket(client4, vip4, 40022, 53, pktgen.SCTPInit),
			XDPTx, "198.18.10.11", "198.18.20.11", 53),
	})
}

// checkEncap verifies every outer header field, the Geneve option, and the inner
// packet: byte for byte the client's packet DNAT'ed to backend, as the builder makes
// it with fresh checksums (which are also recomputed here, independently).
func checkEncap(t *testing.T, e *env, in pktgen.Packet, out []byte, viaC bool, node netip.Addr, backend netip.AddrPort) {
	t.Helper()
	d := pktgen.DecodeGeneve(t, out)
	srcMAC, dstMAC := e.macA, nhMAC
	if viaC {
		srcMAC, dstMAC = e.macC, nh2MAC
	}
	dnat := in
	dnat.Dst, dnat.DstPort = backend.Addr(), backend.Port()
	wantInner := pktgen.Packet{SrcMAC: srcMAC, DstMAC: dstMAC}.Wrap(dnat.IP())
	vip := netip.AddrPortFrom(in.Dst, in.DstPort)
	geneve := pktgen.Geneve{VNI: 2, Options: []pktgen.GeneveOption{pktgen.DSROption(vip)}}.Header()
	outerIPLen := 20
	if node.Is6() {
		outerIPLen = 40
	}
	if want := 14 + outerIPLen + 8 + len(geneve) + len(wantInner); len(out) != want {
		t.Fatalf("output %d bytes, want %d", len(out), want)
	}
	if node.Is4() && vip.Addr().Is4() && len(out)-len(wantInner) != 62 {
		t.Fatalf("IPv4/IPv4 overhead is not 62 bytes")
	}

	if !bytes.Equal(d.Eth.DstMAC, dstMAC) || !bytes.Equal(d.Eth.SrcMAC, srcMAC) {
		t.Errorf("outer MACs %v -> %v, want %v -> %v", d.Eth.SrcMAC, d.Eth.DstMAC, srcMAC, dstMAC)
	}
	if node.Is4() {
		ip := d.IPv4
		if ip == nil {
			t.Fatal("outer header is not IPv4")
		}
		if d.Eth.EthernetType != layers.EthernetTypeIPv4 || ip.IHL != 5 || ip.TTL != 64 || ip.Flags != layers.IPv4DontFragment ||
			ip.Protocol != layers.IPProtocolUDP || ip.TOS != 0x28 || int(ip.Length) != len(out)-14 {
			t.Errorf("outer IPv4 header: %+v", ip)
		}
		if d.Src() != src4 || d.Dst() != node {
			t.Errorf("outer IPv4 %v -> %v, want %v -> %v", d.Src(), d.Dst(), src4, node)
		}
		if !pktgen.IPv4HeaderOK(d.IP[:20]) {
			t.Error("outer IPv4 checksum does not verify")
		}
		if d.UDP.Checksum != 0 {
			t.Errorf("outer UDP checksum %#x over IPv4, want 0", d.UDP.Checksum)
		}
	} else {
		ip := d.IPv6
		if ip == nil {
			t.Fatal("outer header is not IPv6")
		}
		if d.Eth.EthernetType != layers.EthernetTypeIPv6 || ip.HopLimit != 64 || ip.NextHeader != layers.IPProtocolUDP ||
			ip.TrafficClass != 0x28 || int(ip.Length) != len(out)-54 || ip.FlowLabel == 0 {
			t.Errorf("outer IPv6 header: %+v", ip)
		}
		if d.Src() != src6 || d.Dst() != node {
			t.Errorf("outer IPv6 %v -> %v, want %v -> %v", d.Src(), d.Dst(), src6, node)
		}
		if in.Proto == ProtoUDP && in.NoUDPChecksum || in.Proto == ProtoSCTP {
			if d.UDP.Checksum != 0 {
				t.Errorf("outer UDP checksum %#x, want 0 (the inner packet has no one's complement sum to derive it from)", d.UDP.Checksum)
			}
		} else if err := pktgen.VerifyIP(d.IP); err != nil {
			t.Errorf("outer UDP over IPv6: %v", err)
		}
	}
	if d.UDP.DstPort != pktgen.GenevePort || d.UDP.SrcPort < 32768 || int(d.UDP.Length) != len(out)-14-outerIPLen {
		t.Errorf("outer UDP %d -> %d len %d", d.UDP.SrcPort, d.UDP.DstPort, d.UDP.Length)
	}

	// Geneve header and DSR option, byte by byte (docs/wire-format.md).
	if !bytes.Equal(d.Geneve.Contents, geneve) {
		t.Errorf("geneve header and option % x, want % x", d.Geneve.Contents, geneve)
	}
	if d.Geneve.VNI != 2 || d.Geneve.Protocol != layers.EthernetTypeTransparentEthernetBridging || len(d.Geneve.Options) != 1 || !d.Geneve.CriticalOption {
		t.Errorf("gopacket's view of geneve: %+v", d.Geneve)
	}

	// Inner frame.
	pktgen.ExpectFrame(t, out[len(out)-len(wantInner):], wantInner)
	if err := pktgen.VerifyIP(d.Inner.IP); err != nil {
		t.Errorf("inner packet: %v", err)
	}
}

// TestEncapSourcePortSpread checks that the outer UDP source port follows the
// flow: the same flow keeps its port, and different flows spread over the
// 32768-65535 range.
func TestEncapSourcePortSpread(t *testing.T) {
	e := encapEnv(t)
	ports := map[layers.UDPPort]bool{}
	for i := range 64 {
		syn := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: uint16(20000 + i), DstPort: 80}
		_, out1 := e.run(t, syn.Frame())
		_, out2 := e.run(t, ackOf(syn).Frame())
		p1, p2 := pktgen.DecodeGeneve(t, out1).UDP.SrcPort, pktgen.DecodeGeneve(t, out2).UDP.SrcPort
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
