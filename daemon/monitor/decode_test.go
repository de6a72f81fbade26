package monitor

import (
	"net/netip"
	"testing"

	"github.com/lbd-dev/lbd/internal/pktgen"
)

func TestDecode(t *testing.T) {
	client := netip.MustParseAddrPort("198.51.100.7:40000")
	vip := netip.MustParseAddrPort("203.0.113.10:80")
	client6 := netip.MustParseAddrPort("[2001:db8:1::7]:40000")
	vip6 := netip.MustParseAddrPort("[2001:db8::10]:443")
	backend := netip.MustParseAddrPort("198.18.1.10:8080")
	tcp := pktgen.Packet{Src: client.Addr(), Dst: vip.Addr(), SrcPort: client.Port(), DstPort: vip.Port(), Payload: pktgen.Bytes(200)}
	udp := pktgen.Packet{Src: client.Addr(), Dst: vip.Addr(), SrcPort: client.Port(), DstPort: 53, Proto: pktgen.ProtoUDP}
	tcp6 := pktgen.Packet{Src: client6.Addr(), Dst: vip6.Addr(), SrcPort: client6.Port(), DstPort: vip6.Port(), Payload: pktgen.Bytes(1300)}
	inner := pktgen.Packet{Src: client.Addr(), Dst: backend.Addr(), SrcPort: client.Port(), DstPort: backend.Port()}
	snap := func(b []byte) []byte { return b[:min(len(b), 128)] }
	cases := []struct {
		name     string
		frame    []byte
		answered bool
		want     Flow
	}{
		{"tcp as received, cut at 128 bytes", snap(tcp.Frame()), false, Flow{Client: client, Destination: vip, Proto: 6}},
		{"udp", udp.Frame(), false, Flow{Client: client, Destination: netip.AddrPortFrom(vip.Addr(), 53), Proto: 17}},
		{"tcp over ipv6, cut", snap(tcp6.Frame()), false, Flow{Client: client6, Destination: vip6, Proto: 6}},
		{"a reset answering the client", pktgen.Packet{Src: vip.Addr(), Dst: client.Addr(), SrcPort: vip.Port(), DstPort: client.Port(),
			Flags: pktgen.RST | pktgen.ACK}.Frame(), true, Flow{Client: client, Destination: vip, Proto: 6}},
		{"port unreachable quoting the client's datagram", pktgen.Packet{Src: vip.Addr(), Dst: client.Addr(), Proto: pktgen.ProtoICMPv4,
			ICMPType: 3, ICMPCode: 3, Payload: udp.IP()[:28]}.Frame(), true,
			Flow{Client: client, Destination: netip.AddrPortFrom(vip.Addr(), 53), Proto: 17}},
		{"packet too big quoting the client's packet", snap(pktgen.Packet{Src: vip6.Addr(), Dst: client6.Addr(), Proto: pktgen.ProtoICMPv6,
			ICMPType: 2, ICMPRest: 1438, Payload: tcp6.IP()[:1232]}.Frame()), true, Flow{Client: client6, Destination: vip6, Proto: 6}},
		{"encapsulated toward a backend", snap(pktgen.Geneve{Outer: pktgen.Packet{Src: netip.MustParseAddr("198.18.0.11"),
			Dst: netip.MustParseAddr("198.18.0.21")}, VNI: 2, Options: []pktgen.GeneveOption{pktgen.DSROption(vip)}}.Frame(inner.IP())), false,
			Flow{Client: client, Destination: vip, Backend: backend, Proto: 6}},
		{"ipv4 header cut", tcp.Frame()[:20], false, Flow{}},
		{"not ip", []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0x08, 0x06, 0, 1}, false, Flow{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Decode(c.frame, c.answered); got != c.want {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
}
