//go:build linux

package lbxdp

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/lbd-dev/lbd/internal/pktgen"
)

var router4 = netip.MustParseAddr("198.18.0.2")
var router6 = netip.MustParseAddr("2001:db8::2")

// icmpError builds an ICMP error from a router to the VIP about a reply the
// VIP sent (VIP:vport -> client:cport), quoting quote bytes of it.
func icmpError(vip, client netip.Addr, vport, cport uint16, typ, code uint8, info uint32, quote int) []byte {
	reply := pktgen.Packet{Src: vip, Dst: client, SrcPort: vport, DstPort: cport, TTL: 1, DF: true,
		Flags: pktgen.ACK, Seq: 7, Window: 100, Payload: make([]byte, 1000)}
	e := pktgen.Packet{Src: router4, Dst: vip, TTL: 64, Proto: pktgen.ProtoICMPv4, ICMPType: typ, ICMPCode: code,
		ICMPRest: info, Payload: reply.IP()[:quote]}
	if vip.Is6() {
		e.Src, e.Proto = router6, pktgen.ProtoICMPv6
	}
	return e.Frame()
}

// TestICMPErrorForwarding: ICMP errors about a VIP flow reach that flow's
// backend, translated so the backend recognises its own packet.
func TestICMPErrorForwarding(t *testing.T) {
	e := ctEnv(t)
	e.addService(t, svcSetup{ServiceKey{vip4, 90, ProtoTCP}, Service{ID: 10}, nil})
	// Flows known to conntrack, then the tables move to B: errors must follow
	// conntrack, not the table.
	e.sendTo(t, pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 40000, DstPort: 80})
	e.sendTo(t, pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 40000, DstPort: 80})
	e.setTable(t, 1, []uint32{2}, 31)
	e.setTable(t, 3, []uint32{4}, 31)

	notVIP := pktgen.Edit(icmpError(vip4, client4, 80, 1, 3, 4, 1280, 28), func(b []byte, at pktgen.Offsets) {
		copy(b[at.L4+8+12:], vip4b.AsSlice()) // the quoted packet's source
	})
	e.runCases(t, []pktgen.Case[caseEnv, Verdict]{
		{Name: "frag needed, flow in conntrack", In: icmpError(vip4, client4, 80, 40000, 3, 4, 1280, 548),
			Verdict: XDPTx, Check: translated(vip4, client4, beA)},
		{Name: "time exceeded, unknown flow uses the table", In: icmpError(vip4, client4, 80, 40001, 11, 0, 0, 28),
			Verdict: XDPTx, Check: translated(vip4, client4, beB)},
		{Name: "port unreachable quoting ip options-free header+8", In: icmpError(vip4, client4, 80, 40002, 3, 3, 0, 28),
			Verdict: XDPTx, Check: translated(vip4, client4, beB)},
		{Name: "packet too big, flow in conntrack", In: icmpError(vip6, client6, 80, 40000, 2, 0, 1280, 1000),
			Verdict: XDPTx, Check: translated(vip6, client6, be6A)},
		{Name: "ipv6 unreachable, unknown flow", In: icmpError(vip6, client6, 80, 40009, 1, 4, 0, 48),
			Verdict: XDPTx, Check: translated(vip6, client6, be6B)},
		{Name: "error about a port without service", In: icmpError(vip4, client4, 9999, 1, 3, 4, 1280, 28),
			Verdict: XDPDrop, Check: counted(DropNoService)},
		{Name: "embedded source is not the vip", In: notVIP, Verdict: XDPDrop, Check: counted(DropNoService)},
		{Name: "truncated embedded header", In: icmpError(vip4, client4, 80, 1, 3, 4, 1280, 12),
			Verdict: XDPDrop, Check: counted(DropMalformed)},
		{Name: "service without backend", In: icmpError(vip4, client4, 90, 1, 3, 4, 1280, 28),
			Verdict: XDPDrop, Check: counted(DropNoBackend)},
	})
}

// translated checks an ICMP error forwarded to backend: wrapped with the DSR
// option of the VIP's service (port 80), re-addressed to the backend, quoting
// the packet as the backend sent it (from its port 8080 to the client), with
// every checksum that can be recomputed correct.
func translated(vip, client, backend netip.Addr) check {
	return func(t *testing.T, _ caseEnv, _, out []byte) {
		t.Helper()
		d := pktgen.DecodeGeneve(t, out)
		if opt := d.Geneve.Options[0].Data; !bytes.Equal(opt, pktgen.DSROption(netip.AddrPortFrom(vip, 80)).Data) {
			t.Errorf("DSR option % x", opt)
		}
		in := d.Inner
		router, quote := router4, []byte(nil)
		switch {
		case in.ICMPv4 != nil:
			quote = in.ICMPv4.Payload
		case in.ICMPv6 != nil:
			router, quote = router6, in.ICMPv6.Payload[4:]
		default:
			t.Fatalf("not an ICMP error:\n%s", d.Packet.Dump())
		}
		if in.Src() != router || in.Dst() != backend {
			t.Errorf("outer ICMP packet %v -> %v", in.Src(), in.Dst())
		}
		if err := pktgen.VerifyIP(in.IP); err != nil {
			t.Errorf("after translation: %v", err)
		}
		var embSrc, embDst netip.Addr
		if vip.Is4() {
			if !pktgen.IPv4HeaderOK(quote[:20]) {
				t.Error("embedded IPv4 checksum does not verify")
			}
			embSrc, embDst, quote = netip.AddrFrom4([4]byte(quote[12:16])), netip.AddrFrom4([4]byte(quote[16:20])), quote[20:]
		} else {
			embSrc, embDst, quote = netip.AddrFrom16([16]byte(quote[8:24])), netip.AddrFrom16([16]byte(quote[24:40])), quote[40:]
		}
		if embSrc != backend || embDst != client {
			t.Errorf("embedded packet %v -> %v, want %v -> %v", embSrc, embDst, backend, client)
		}
		if port := binary.BigEndian.Uint16(quote); port != 8080 {
			t.Errorf("embedded source port %d, want the backend's 8080", port)
		}
	}
}
