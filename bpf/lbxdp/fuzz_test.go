//go:build linux

package lbxdp

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/lbd-dev/lbd/internal/pktgen"
)

// fuzzServices are the services of the fuzz environment (encapEnv's).
var fuzzServices = map[ServiceKey]bool{
	{vip4, 80, ProtoTCP}: true, {vip4, 53, ProtoUDP}: true, {vip4, 81, ProtoTCP}: true,
	{vip4, 82, ProtoTCP}: true, {vip4, 83, ProtoUDP}: true, {vip6, 80, ProtoTCP}: true,
	{vip6, 81, ProtoTCP}: true, {vip6, 53, ProtoUDP}: true, {vip4b, 0, ProtoTCP}: true,
	{vip6, 82, ProtoTCP}: true,
}

// wellFormedForVIP is the fuzz oracle, written independently of the C parser:
// Ethernet with at most one VLAN tag, a complete unfragmented IPv4/IPv6 packet
// to a VIP, carrying either a complete TCP/UDP header to a configured service
// or an ICMP error.
func wellFormedForVIP(b []byte) bool {
	if len(b) < 14 {
		return false
	}
	et, l3 := binary.BigEndian.Uint16(b[12:]), 14
	if et == 0x8100 || et == 0x88a8 {
		if len(b) < 18 {
			return false
		}
		et, l3 = binary.BigEndian.Uint16(b[16:]), 18
	}
	ip := b[l3:]
	var dst netip.Addr
	var proto uint8
	var l4 []byte
	switch et {
	case 0x0800:
		if len(ip) < 20 || ip[0]>>4 != 4 {
			return false
		}
		ihl, tot := int(ip[0]&0x0f)*4, int(binary.BigEndian.Uint16(ip[2:]))
		if ihl < 20 || tot < ihl || tot > len(ip) || binary.BigEndian.Uint16(ip[6:])&0x3fff != 0 {
			return false
		}
		dst, proto, l4 = netip.AddrFrom4([4]byte(ip[16:20])), ip[9], ip[ihl:tot]
	case 0x86dd:
		if len(ip) < 40 || ip[0]>>4 != 6 {
			return false
		}
		end := 40 + int(binary.BigEndian.Uint16(ip[4:]))
		if end > len(ip) {
			return false
		}
		dst, proto = netip.AddrFrom16([16]byte(ip[24:40])), ip[6]
		off := 40
		for proto == 0 || proto == 43 || proto == 60 || proto == 51 || proto == 44 {
			if off+8 > end {
				return false
			}
			n := (int(ip[off+1]) + 1) * 8
			if proto == 51 {
				n = (int(ip[off+1]) + 2) * 4
			}
			if proto == 44 {
				if binary.BigEndian.Uint16(ip[off+2:])&0xfff9 != 0 {
					return false // a real fragment
				}
				n = 8
			}
			proto = ip[off]
			off += n
		}
		if off > end {
			return false
		}
		l4 = ip[off:end]
	default:
		return false
	}
	switch proto {
	case ProtoTCP, ProtoUDP:
		if len(l4) < 8 {
			return false
		}
		if proto == ProtoTCP && (len(l4) < 20 || int(l4[12]>>4)*4 < 20 || int(l4[12]>>4)*4 > len(l4)) {
			return false
		}
		if proto == ProtoUDP {
			if n := int(binary.BigEndian.Uint16(l4[4:])); n < 8 || n > len(l4) {
				return false
			}
		}
		port := binary.BigEndian.Uint16(l4[2:])
		return fuzzServices[ServiceKey{dst, port, proto}] || fuzzServices[ServiceKey{dst, 0, proto}]
	case 1:
		return len(l4) >= 8 && (l4[0] == 3 || l4[0] == 11 || l4[0] == 12) && dst.Is4()
	case 58:
		return len(l4) >= 8 && l4[0] >= 1 && l4[0] <= 4 && dst.Is6()
	}
	return false
}

// FuzzDatapath feeds arbitrary frames through the program: it must never
// abort, and never transmit or redirect a frame that is not a well-formed
// packet for a configured VIP.
func FuzzDatapath(f *testing.F) {
	e := encapEnv(f)
	seeds := [][]byte{
		pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1, DstPort: 80, Payload: pktgen.Bytes(10)}.Frame(),
		pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1, DstPort: 53, Proto: ProtoUDP, Payload: pktgen.Bytes(3)}.Frame(),
		pktgen.Packet{Src: client4, Dst: vip4b, SrcPort: 1, DstPort: 22, VLAN: 4}.Frame(),
		pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1, DstPort: 80, IPOptions: nops}.Frame(),
		pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 1, DstPort: 81, HopByHop: true}.Frame(),
		pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 1, DstPort: 53, Proto: ProtoUDP}.Frame(),
		pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1, DstPort: 82, DF: true, Payload: pktgen.Bytes(1450)}.Frame(),
		pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1, DstPort: 8000}.Frame(),
		icmpError(vip4, client4, 80, 40000, 3, 4, 1280, 28),
		icmpError(vip6, client6, 80, 40000, 2, 0, 1280, 48),
		pktgen.ARPRequest(clientMAC, client4, vip4),
		echoFrame(client4, vip4),
	}
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		if len(frame) < 14 || len(frame) > 3000 {
			t.Skip("BPF_PROG_TEST_RUN needs an Ethernet header and a frame that fits a page")
		}
		v, out := e.run(t, frame)
		switch v {
		case XDPDrop, XDPPass:
		case XDPTx, XDPRedirect:
			if !wellFormedForVIP(frame) {
				t.Fatalf("%v for a frame that is not a well-formed VIP packet: % x", v, frame)
			}
			if len(out) < 14 {
				t.Fatalf("%v of a %d-byte frame", v, len(out))
			}
		default:
			t.Fatalf("verdict %v", v)
		}
	})
}
