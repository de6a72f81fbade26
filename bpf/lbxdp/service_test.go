//go:build linux

package lbxdp

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/lbd-dev/lbd/internal/pktgen"
)

// echoFrame is an ICMP echo request (IPv4) or a neighbour solicitation (IPv6):
// traffic to an address that is no service's.
func echoFrame(src, dst netip.Addr) []byte {
	if src.Is4() {
		return pktgen.Packet{Src: src, Dst: dst, TTL: 64, Proto: pktgen.ProtoICMPv4, ICMPType: 8, ICMPRest: 1<<16 | 1,
			Payload: []byte("ping")}.Frame()
	}
	return pktgen.Packet{Src: src, Dst: dst, TTL: 64, Proto: pktgen.ProtoICMPv6, ICMPType: 135, Payload: dst.AsSlice()}.Frame()
}

// TestPass: traffic that is not for a VIP leaves untouched, and so does neighbour
// discovery whatever its target. Traffic for a VIP that no service takes is dropped
// and counted (no_service): the LB node does not own the VIP, so the kernel would
// route it back to the router, which sends it here again until its TTL runs out.
func TestPass(t *testing.T) {
	e := encapEnv(t)
	other4 := netip.MustParseAddr("203.0.113.99")
	other6 := netip.MustParseAddr("2001:db8:f00::99")
	truncatedTCP := pktgen.Edit(pktgen.Packet{Src: client4, Dst: other4, SrcPort: 1, DstPort: 80}.Frame(), func(b []byte, at pktgen.Offsets) {
		binary.BigEndian.PutUint16(b[at.L3+2:], 20+10) // IPv4 total length: header + 10 bytes
	})[:14+20+10]
	pass := func(name string, frame []byte) pktgen.Case[caseEnv, Verdict] {
		return pktgen.Case[caseEnv, Verdict]{Name: name, In: frame, Verdict: XDPPass, Check: unchanged}
	}
	noService := func(name string, frame []byte) pktgen.Case[caseEnv, Verdict] {
		return pktgen.Case[caseEnv, Verdict]{Name: name, In: frame, Verdict: XDPDrop, Check: counted(DropNoService)}
	}
	e.runCases(t, []pktgen.Case[caseEnv, Verdict]{
		pass("arp", pktgen.ARPRequest(clientMAC, client4, vip4)),
		pass("tcp4 to another address", pktgen.Packet{Src: client4, Dst: other4, SrcPort: 1234, DstPort: 80}.Frame()),
		pass("udp6 to another address", pktgen.Packet{Src: client6, Dst: other6, SrcPort: 1234, DstPort: 53, Proto: ProtoUDP}.Frame()),
		noService("vip port without service", pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1234, DstPort: 8081}.Frame()),
		noService("vip6 port without service", pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 1234, DstPort: 8081}.Frame()),
		noService("udp to a tcp-only port", pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1234, DstPort: 80, Proto: ProtoUDP}.Frame()),
		noService("udp to a tcp wildcard vip", pktgen.Packet{Src: client4, Dst: vip4b, SrcPort: 1234, DstPort: 80, Proto: ProtoUDP}.Frame()),
		noService("icmp echo to vip", echoFrame(client4, vip4)),
		noService("icmpv6 echo to vip6", pktgen.Packet{Src: client6, Dst: vip6, TTL: 64, Proto: pktgen.ProtoICMPv6, ICMPType: 128,
			ICMPRest: 1<<16 | 1, Payload: []byte("ping")}.Frame()),
		noService("another protocol to vip", pktgen.Edit(pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1, DstPort: 80}.Frame(),
			func(b []byte, at pktgen.Offsets) { setIPv4Protocol(b[at.L3:], 253) })),
		pass("neighbour solicitation to vip6", echoFrame(client6, vip6)),
		pass("truncated tcp to another address", truncatedTCP),
		pass("tcp4 from the vip", pktgen.Packet{Src: vip4, Dst: client4, SrcPort: 80, DstPort: 1234}.Frame()),
	})
}

// setIPv4Protocol changes an IPv4 header's protocol and fixes its checksum.
func setIPv4Protocol(ip []byte, proto byte) {
	ip[9] = proto
	binary.BigEndian.PutUint16(ip[10:], 0)
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
}

// TestWildcardPort: a port-0 service takes every port of its VIP and
// protocol, an exact-port service on the same VIP wins over it; deleting the
// wildcard drops its ports as no_service while the VIP has a service, and deleting
// every service makes the address pass again.
func TestWildcardPort(t *testing.T) {
	e := encapEnv(t)
	e.addBackend(t, 8, "198.18.20.8", 9000, "198.18.10.8")
	exact := ServiceKey{vip4b, 443, ProtoTCP}
	e.addService(t, svcSetup{exact, Service{ID: 11}, []uint32{8}})

	cases := []struct {
		port    uint16
		backend string
		bport   uint16
	}{
		{1, "198.18.20.6", 1},
		{22, "198.18.20.6", 22},
		{65535, "198.18.20.6", 65535},
		{443, "198.18.20.8", 9000},
	}
	for _, c := range cases {
		v, out := e.run(t, pktgen.Packet{Src: client4, Dst: vip4b, SrcPort: 5555, DstPort: c.port}.Frame())
		if v != XDPTx {
			t.Fatalf("port %d: verdict %v", c.port, v)
		}
		d := pktgen.DecodeGeneve(t, out).Inner
		if d.Dst() != netip.MustParseAddr(c.backend) || uint16(d.TCP.DstPort) != c.bport {
			t.Errorf("port %d went to %v:%d, want %s:%d", c.port, d.Dst(), d.TCP.DstPort, c.backend, c.bport)
		}
	}

	if err := e.d.DeleteService(ServiceKey{vip4b, 0, ProtoTCP}); err != nil {
		t.Fatal(err)
	}
	if v, _ := e.run(t, pktgen.Packet{Src: client4, Dst: vip4b, SrcPort: 5556, DstPort: 22}.Frame()); v != XDPDrop {
		t.Errorf("after deleting the wildcard service: verdict %v, want XDP_DROP (no service)", v)
	}
	if v, _ := e.run(t, pktgen.Packet{Src: client4, Dst: vip4b, SrcPort: 5556, DstPort: 443}.Frame()); v != XDPTx {
		t.Errorf("exact service after wildcard deletion: verdict %v, want XDP_TX", v)
	}
	if err := e.d.DeleteService(exact); err != nil {
		t.Fatal(err)
	}
	if v, _ := e.run(t, pktgen.Packet{Src: client4, Dst: vip4b, SrcPort: 5557, DstPort: 443}.Frame()); v != XDPPass {
		t.Errorf("after deleting every service of the VIP: verdict %v, want XDP_PASS", v)
	}
	svcs, err := e.d.Services()
	if err != nil {
		t.Fatal(err)
	}
	for k := range svcs {
		if k.VIP == vip4b {
			t.Errorf("service %v still listed", k)
		}
	}
	if s, ok := svcs[ServiceKey{vip6, 53, ProtoUDP}]; !ok || s.ID != 8 {
		t.Errorf("listing lost service 8: %+v", s)
	}
}

func TestServiceValidation(t *testing.T) {
	e := newEnv(t)
	bad := []struct {
		name string
		k    ServiceKey
		s    Service
	}{
		{"id out of range", ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 256}},
		{"bad protocol", ServiceKey{vip4, 80, 1}, Service{ID: 1}},
		{"invalid vip", ServiceKey{netip.Addr{}, 80, ProtoTCP}, Service{ID: 1}},
		{"sub-second affinity", ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1, AffinityTimeout: 1}},
	}
	for _, c := range bad {
		if err := e.d.UpsertService(c.k, c.s); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
	if err := e.d.UpsertBackend(0, Backend{Addr: client4, Node: client4}); err == nil {
		t.Error("backend ID 0 accepted")
	}
	if err := e.d.SetMaglevTable(1, nil); err == nil {
		t.Error("empty table accepted")
	}
	if err := e.d.SetConfig(Config{VNI: 1 << 24}); err == nil {
		t.Error("25-bit VNI accepted")
	}
}
