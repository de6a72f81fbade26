//go:build linux

package lbxdp

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"

	"github.com/lbd-dev/lbd/internal/pktgen"
)

// replyLink checks that a reply goes back by the link its frame came in on (MACs
// swapped, VLAN tag kept) and returns where the reply's IP header starts.
func replyLink(t *testing.T, in, out []byte) int {
	t.Helper()
	l3 := pktgen.Locate(in).L3
	if l3 == 18 && !bytes.Equal(out[12:18], in[12:18]) {
		t.Errorf("VLAN tag % x, want % x", out[12:18], in[12:18])
	}
	if !bytes.Equal(out[0:6], in[6:12]) || !bytes.Equal(out[6:12], in[0:6]) {
		t.Errorf("reply MACs %v -> %v, want swapped", net.HardwareAddr(out[6:12]), net.HardwareAddr(out[0:6]))
	}
	return l3
}

// icmpReply checks an ICMP/ICMPv6 error built by the program: sent back to the
// client from the VIP on the link it came from, the type-specific word, the
// quote of the original packet, and checksums recomputed here.
func icmpReply(typ, code uint8, info uint32) check {
	return func(t *testing.T, _ caseEnv, in, out []byte) {
		t.Helper()
		l3 := replyLink(t, in, out)
		din, d := pktgen.Decode(t, in), pktgen.Decode(t, out)
		quote := din.IP[:min(len(din.IP), 128)]
		ipb := out[l3:]
		hl := 20
		if din.IPv4 != nil {
			if !bytes.Equal(out[l3-2:l3], []byte{0x08, 0x00}) || ipb[0] != 0x45 || ipb[9] != 1 || ipb[8] != 64 {
				t.Errorf("reply IPv4 header % x", ipb[:20])
			}
			if int(binary.BigEndian.Uint16(ipb[2:])) != len(ipb) {
				t.Errorf("reply IPv4 length %d of %d", binary.BigEndian.Uint16(ipb[2:]), len(ipb))
			}
		} else {
			hl = 40
			if !bytes.Equal(out[l3-2:l3], []byte{0x86, 0xdd}) || ipb[0]>>4 != 6 || ipb[6] != 58 || ipb[7] != 64 {
				t.Errorf("reply IPv6 header % x", ipb[:40])
			}
			if int(binary.BigEndian.Uint16(ipb[4:]))+40 != len(ipb) {
				t.Errorf("reply IPv6 payload length %d of %d", binary.BigEndian.Uint16(ipb[4:]), len(ipb))
			}
		}
		if d.Src() != din.Dst() || d.Dst() != din.Src() {
			t.Errorf("reply %v -> %v, want %v -> %v", d.Src(), d.Dst(), din.Dst(), din.Src())
		}
		if err := pktgen.VerifyIP(ipb); err != nil {
			t.Errorf("reply: %v", err)
		}
		icmp := ipb[hl:]
		if icmp[0] != typ || icmp[1] != code || binary.BigEndian.Uint32(icmp[4:]) != info {
			t.Errorf("ICMP type %d code %d info %d, want %d %d %d", icmp[0], icmp[1], binary.BigEndian.Uint32(icmp[4:]), typ, code, info)
		}
		if !bytes.Equal(icmp[8:], quote) {
			t.Errorf("quoted %d bytes, want the first %d bytes of the original packet", len(icmp[8:]), len(quote))
		}
	}
}

// TestTooBig: a packet that would not fit the egress MTU once encapsulated is
// answered with ICMP "fragmentation needed" (IPv4 + DF) or ICMPv6 "packet too
// big" carrying egress MTU minus overhead; a packet that fits exactly goes
// through.
func TestTooBig(t *testing.T) {
	e := newEnv(t)
	e.addBackend(t, 1, "198.18.20.1", 8080, "198.18.12.1")       // IPv4 node, route MTU 1400
	e.addBackend(t, 2, "2001:db8:20::2", 8080, "2001:db8:12::2") // IPv6 node, route MTU 1400
	e.addBackend(t, 3, "2001:db8:20::3", 8080, "198.18.12.3")
	e.addBackend(t, 4, "198.18.20.4", 8080, "198.18.10.4") // device MTU 1500
	e.addBackend(t, 5, "198.18.20.5", 8080, "2001:db8:12::5")
	e.addService(t, svcSetup{ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1}, []uint32{1}})
	e.addService(t, svcSetup{ServiceKey{vip6, 80, ProtoTCP}, Service{ID: 2}, []uint32{2}})
	e.addService(t, svcSetup{ServiceKey{vip6, 81, ProtoTCP}, Service{ID: 3}, []uint32{3}})
	e.addService(t, svcSetup{ServiceKey{vip4, 81, ProtoUDP}, Service{ID: 4}, []uint32{4}})
	e.addService(t, svcSetup{ServiceKey{vip4, 82, ProtoTCP}, Service{ID: 5}, []uint32{5}})

	// Payload giving an IPv4 TCP packet of n bytes.
	tcp4 := func(n int) []byte { return pktgen.Bytes(n - 40) }
	tooBig := func(typ, code uint8, mtu uint32) check { return counted(DropTooBig, icmpReply(typ, code, mtu)) }
	e.runCases(t, []pktgen.Case[caseEnv, Verdict]{
		{Name: "ipv4 df over ipv4, one byte too many", In: pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1, DstPort: 80, DF: true,
			Payload: tcp4(1400 - 62 + 1)}.Frame(), Verdict: XDPTx, Check: tooBig(3, 4, 1338)},
		{Name: "ipv4 df over ipv4, exact fit", In: pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 2, DstPort: 80, DF: true,
			Payload: tcp4(1400 - 62)}.Frame(), Verdict: XDPTx},
		{Name: "ipv4 df full size", In: pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 3, DstPort: 80, DF: true,
			Payload: pktgen.Bytes(1400)}.Frame(), Verdict: XDPTx, Check: tooBig(3, 4, 1338)},
		{Name: "ipv4 df vlan tagged", In: pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 4, DstPort: 80, DF: true,
			Payload: pktgen.Bytes(1400), VLAN: 9}.Frame(), Verdict: XDPTx, Check: tooBig(3, 4, 1338)},
		{Name: "udp4 df at device mtu 1500", In: pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 5, DstPort: 81, Proto: ProtoUDP, DF: true,
			Payload: pktgen.Bytes(1472)}.Frame(), Verdict: XDPTx, Check: tooBig(3, 4, 1438)},
		{Name: "ipv4 df over ipv6 underlay", In: pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 6, DstPort: 82, DF: true,
			Payload: pktgen.Bytes(1400)}.Frame(), Verdict: XDPTx, Check: tooBig(3, 4, 1400-82)},
		{Name: "ipv6 over ipv6", In: pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 7, DstPort: 80,
			Payload: pktgen.Bytes(1400)}.Frame(), Verdict: XDPTx, Check: tooBig(2, 0, 1400-94)},
		{Name: "ipv6 over ipv6, exact fit", In: pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 8, DstPort: 80,
			Payload: pktgen.Bytes(1400 - 94 - 60)}.Frame(), Verdict: XDPTx},
		{Name: "ipv6 over ipv4", In: pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 9, DstPort: 81,
			Payload: pktgen.Bytes(1400)}.Frame(), Verdict: XDPTx, Check: tooBig(2, 0, 1400-74)},
		{Name: "ipv4 without df is dropped and counted", In: pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 10, DstPort: 80,
			Payload: pktgen.Bytes(1400)}.Frame(), Verdict: XDPDrop, Check: counted(DropTooBigUnsignaled)},
	})
}

// TestTooBigNeverBelowTheMinimum: a route whose MTU leaves less than IPv6's 1280 bytes
// (or IPv4's 576) once encapsulated is never announced to clients, who would ignore it
// and keep sending packets that do not fit: those are counted as unsignaled.
func TestTooBigNeverBelowTheMinimum(t *testing.T) {
	e := newEnv(t)
	e.ns.IP(t, "route add 2001:db8:13::/64 via 2001:db8::2 dev "+e.devA+" mtu lock 1350",
		"route add 198.18.15.0/24 via 198.18.0.2 dev "+e.devA+" mtu lock 600")
	e.addBackend(t, 1, "2001:db8:20::1", 8080, "2001:db8:13::1") // 1350 - 94 = 1256 for IPv6 clients
	e.addBackend(t, 2, "198.18.20.2", 8080, "198.18.15.2")       // 600 - 62 = 538 for IPv4 clients
	e.addBackend(t, 3, "2001:db8:20::3", 8080, "198.18.15.3")    // 600 - 74 = 526 for IPv6 clients
	e.addService(t, svcSetup{ServiceKey{vip6, 80, ProtoTCP}, Service{ID: 1}, []uint32{1}})
	e.addService(t, svcSetup{ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 2}, []uint32{2}})
	e.addService(t, svcSetup{ServiceKey{vip6, 81, ProtoTCP}, Service{ID: 3}, []uint32{3}})
	e.runCases(t, []pktgen.Case[caseEnv, Verdict]{
		{Name: "ipv6 client, 1256 bytes left", In: pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 1, DstPort: 80,
			Payload: pktgen.Bytes(1300)}.Frame(), Verdict: XDPDrop, Check: counted(DropTooBigUnsignaled)},
		{Name: "ipv4 client, 538 bytes left", In: pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 2, DstPort: 80, DF: true,
			Payload: pktgen.Bytes(600)}.Frame(), Verdict: XDPDrop, Check: counted(DropTooBigUnsignaled)},
		{Name: "ipv6 client over ipv4, 526 bytes left", In: pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 3, DstPort: 81,
			Payload: pktgen.Bytes(600)}.Frame(), Verdict: XDPDrop, Check: counted(DropTooBigUnsignaled)},
	})
}
