//go:build linux

package lbxdp

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

func serialize(tb testing.TB, ls ...gopacket.SerializableLayer) []byte {
	tb.Helper()
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

func arpFrame(tb testing.TB) []byte {
	return serialize(tb,
		&layers.Ethernet{SrcMAC: clientMAC, DstMAC: layers.EthernetBroadcast, EthernetType: layers.EthernetTypeARP},
		&layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
			Operation: layers.ARPRequest, SourceHwAddress: clientMAC, SourceProtAddress: client4.AsSlice(),
			DstHwAddress: make([]byte, 6), DstProtAddress: vip4.AsSlice()})
}

func echoFrame(tb testing.TB, src, dst netip.Addr) []byte {
	if src.Is4() {
		return serialize(tb,
			&layers.Ethernet{SrcMAC: clientMAC, DstMAC: nhMAC, EthernetType: layers.EthernetTypeIPv4},
			&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()},
			&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 1, Seq: 1},
			gopacket.Payload([]byte("ping")))
	}
	ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolICMPv6, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	icmp := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeNeighborSolicitation, 0)}
	_ = icmp.SetNetworkLayerForChecksum(ip)
	return serialize(tb, &layers.Ethernet{SrcMAC: clientMAC, DstMAC: nhMAC, EthernetType: layers.EthernetTypeIPv6}, ip, icmp,
		gopacket.Payload(append(make([]byte, 4), dst.AsSlice()...)))
}

// TestPass: traffic that is not for a configured VIP service leaves untouched.
func TestPass(t *testing.T) {
	e := encapEnv(t)
	other4 := netip.MustParseAddr("203.0.113.99")
	other6 := netip.MustParseAddr("2001:db8:f00::99")
	truncatedTCP := pkt{src: client4, dst: other4, sport: 1, dport: 80}.build(t)[:14+20+10]
	truncatedTCP[14+3] = 30 // IPv4 total length: header + 10 bytes
	truncatedTCP[14+10], truncatedTCP[14+11] = 0, 0
	cases := []struct {
		name  string
		frame []byte
	}{
		{"arp", arpFrame(t)},
		{"tcp4 to another address", pkt{src: client4, dst: other4, sport: 1234, dport: 80}.build(t)},
		{"udp6 to another address", pkt{src: client6, dst: other6, sport: 1234, dport: 53, proto: ProtoUDP}.build(t)},
		{"vip port without service", pkt{src: client4, dst: vip4, sport: 1234, dport: 8081}.build(t)},
		{"vip6 port without service", pkt{src: client6, dst: vip6, sport: 1234, dport: 8081}.build(t)},
		{"udp to a tcp-only port", pkt{src: client4, dst: vip4, sport: 1234, dport: 80, proto: ProtoUDP}.build(t)},
		{"udp to a tcp wildcard vip", pkt{src: client4, dst: vip4b, sport: 1234, dport: 80, proto: ProtoUDP}.build(t)},
		{"icmp echo to vip", echoFrame(t, client4, vip4)},
		{"neighbour solicitation to vip6", echoFrame(t, client6, vip6)},
		{"truncated tcp to another address", truncatedTCP},
		{"tcp4 from the vip", pkt{src: vip4, dst: client4, sport: 80, dport: 1234}.build(t)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v, out := e.run(t, c.frame)
			if v != XDPPass {
				t.Fatalf("verdict %v, want XDP_PASS", v)
			}
			if !bytes.Equal(out, c.frame) {
				t.Fatal("passed frame was modified")
			}
		})
	}
}

// TestWildcardPort: a port-0 service takes every port of its VIP and
// protocol, an exact-port service on the same VIP wins over it, and deleting
// services makes the VIP pass again.
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
		v, out := e.run(t, pkt{src: client4, dst: vip4b, sport: 5555, dport: c.port}.build(t))
		if v != XDPTx {
			t.Fatalf("port %d: verdict %v", c.port, v)
		}
		d := decodeEncap(t, out)
		if innerDst(d) != netip.MustParseAddr(c.backend) || uint16(d.tcp.DstPort) != c.bport {
			t.Errorf("port %d went to %v:%d, want %s:%d", c.port, innerDst(d), d.tcp.DstPort, c.backend, c.bport)
		}
	}

	if err := e.d.DeleteService(ServiceKey{vip4b, 0, ProtoTCP}); err != nil {
		t.Fatal(err)
	}
	if v, _ := e.run(t, pkt{src: client4, dst: vip4b, sport: 5556, dport: 22}.build(t)); v != XDPPass {
		t.Errorf("after deleting the wildcard service: verdict %v, want XDP_PASS", v)
	}
	if v, _ := e.run(t, pkt{src: client4, dst: vip4b, sport: 5556, dport: 443}.build(t)); v != XDPTx {
		t.Errorf("exact service after wildcard deletion: verdict %v, want XDP_TX", v)
	}
	if err := e.d.DeleteService(exact); err != nil {
		t.Fatal(err)
	}
	if v, _ := e.run(t, pkt{src: client4, dst: vip4b, sport: 5557, dport: 443}.build(t)); v != XDPPass {
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
