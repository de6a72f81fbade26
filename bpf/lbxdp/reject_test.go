//go:build linux

package lbxdp

import (
	"encoding/binary"
	"testing"

	"github.com/lbd-dev/lbd/internal/pktgen"
)

// TestReject: new flows to a service without a usable backend are answered
// like Kubernetes does (TCP RST, ICMP/ICMPv6 port unreachable), or dropped
// when the service asks for it; both are counted.
func TestReject(t *testing.T) {
	e := newEnv(t)
	e.addService(t, svcSetup{ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1}, nil})
	e.addService(t, svcSetup{ServiceKey{vip4, 53, ProtoUDP}, Service{ID: 2}, nil})
	e.addService(t, svcSetup{ServiceKey{vip6, 80, ProtoTCP}, Service{ID: 3}, nil})
	e.addService(t, svcSetup{ServiceKey{vip6, 53, ProtoUDP}, Service{ID: 4}, nil})
	e.addService(t, svcSetup{ServiceKey{vip4, 81, ProtoTCP}, Service{ID: 5, DropNoBackend: true}, nil})
	// A table whose only backend was deleted rejects too.
	e.addService(t, svcSetup{ServiceKey{vip4, 82, ProtoTCP}, Service{ID: 6}, []uint32{42}})

	const rstAck = pktgen.RST | pktgen.ACK
	e.runCases(t, []pktgen.Case[caseEnv, Verdict]{
		{Name: "tcp4 syn", In: pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1111, DstPort: 80}.Frame(),
			Verdict: XDPTx, Check: rst(rstAck, 0, 1001)},
		{Name: "tcp4 ack with data", In: pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1112, DstPort: 80, Flags: pktgen.ACK | pktgen.PSH,
			Payload: pktgen.Bytes(10)}.Frame(), Verdict: XDPTx, Check: rst(pktgen.RST, 5000, 0)},
		{Name: "tcp4 fin without ack", In: pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1113, DstPort: 80, Flags: pktgen.FIN,
			Payload: pktgen.Bytes(3)}.Frame(), Verdict: XDPTx, Check: rst(rstAck, 0, 1004)},
		{Name: "tcp4 syn with ip options", In: pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1114, DstPort: 80, IPOptions: nops}.Frame(),
			Verdict: XDPTx, Check: rst(rstAck, 0, 1001)},
		{Name: "tcp4 syn vlan", In: pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1115, DstPort: 80, VLAN: 5}.Frame(),
			Verdict: XDPTx, Check: rst(rstAck, 0, 1001)},
		{Name: "tcp4 dangling backend", In: pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1116, DstPort: 82}.Frame(),
			Verdict: XDPTx, Check: rst(rstAck, 0, 1001)},
		{Name: "tcp6 syn", In: pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 1117, DstPort: 80}.Frame(),
			Verdict: XDPTx, Check: rst(rstAck, 0, 1001)},
		{Name: "tcp6 syn hop-by-hop", In: pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 1118, DstPort: 80, HopByHop: true,
			Payload: pktgen.Bytes(20)}.Frame(), Verdict: XDPTx, Check: rst(rstAck, 0, 1021)},
		{Name: "udp4", In: pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 2222, DstPort: 53, Proto: ProtoUDP,
			Payload: pktgen.Bytes(30)}.Frame(), Verdict: XDPTx, Check: icmpReply(3, 3, 0)},
		{Name: "udp4 large quote capped", In: pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 2223, DstPort: 53, Proto: ProtoUDP,
			Payload: pktgen.Bytes(500)}.Frame(), Verdict: XDPTx, Check: icmpReply(3, 3, 0)},
		{Name: "udp6", In: pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 2224, DstPort: 53, Proto: ProtoUDP,
			Payload: pktgen.Bytes(30)}.Frame(), Verdict: XDPTx, Check: icmpReply(1, 4, 0)},
		{Name: "udp6 vlan", In: pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 2225, DstPort: 53, Proto: ProtoUDP,
			Payload: pktgen.Bytes(1), VLAN: 12}.Frame(), Verdict: XDPTx, Check: icmpReply(1, 4, 0)},
		{Name: "rst is not answered", In: pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 3333, DstPort: 80, Flags: pktgen.RST}.Frame(),
			Verdict: XDPDrop},
		{Name: "drop option", In: pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 4444, DstPort: 81}.Frame(),
			Verdict: XDPDrop, Check: counted(DropNoBackend)},
	})
}

// rst checks a TCP reset sent by the program (counted as rejected): back on the
// link, from the VIP's port to the client's, with these flags and numbers, no
// options, checksums recomputed here.
func rst(flags pktgen.TCPFlags, seq, ack uint32) check {
	return counted(DropRejected, func(t *testing.T, _ caseEnv, in, out []byte) {
		t.Helper()
		l3 := replyLink(t, in, out)
		din, d := pktgen.Decode(t, in), pktgen.Decode(t, out)
		ipb := out[l3:]
		var tcp []byte
		if din.IPv4 != nil {
			if len(ipb) != 40 || ipb[0] != 0x45 || ipb[9] != 6 || binary.BigEndian.Uint16(ipb[2:]) != 40 {
				t.Fatalf("RST IPv4 header % x (len %d)", ipb[:20], len(ipb))
			}
			tcp = ipb[20:]
		} else {
			if len(ipb) != 60 || ipb[6] != 6 || binary.BigEndian.Uint16(ipb[4:]) != 20 {
				t.Fatalf("RST IPv6 header % x (len %d)", ipb[:40], len(ipb))
			}
			tcp = ipb[40:]
		}
		if d.Src() != din.Dst() || d.Dst() != din.Src() {
			t.Errorf("RST addresses %v -> %v", d.Src(), d.Dst())
		}
		if d.TCP.SrcPort != din.TCP.DstPort || d.TCP.DstPort != din.TCP.SrcPort {
			t.Errorf("RST ports %d -> %d", d.TCP.SrcPort, d.TCP.DstPort)
		}
		if pktgen.TCPFlags(tcp[13]) != flags || binary.BigEndian.Uint32(tcp[4:]) != seq || binary.BigEndian.Uint32(tcp[8:]) != ack || tcp[12] != 0x50 {
			t.Errorf("RST flags %#x seq %d ack %d, want %#x %d %d", tcp[13], binary.BigEndian.Uint32(tcp[4:]), binary.BigEndian.Uint32(tcp[8:]), flags, seq, ack)
		}
		if err := pktgen.VerifyIP(ipb); err != nil {
			t.Errorf("RST: %v", err)
		}
	})
}
