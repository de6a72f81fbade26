// Package pktgen is what the BPF program tests share, in the spirit of Cilium's
// PKTGEN/SETUP/CHECK tests: builders for the frames a test feeds a program (Packet,
// Geneve), a decoder and assertions for what comes out (Decode, VerifyIP, Diff), and a
// runner that puts both through BPF_PROG_TEST_RUN (Prog, Case, Run). A test case then
// reads as: packet in, state, expected verdict, expected packet out.
//
// The builders write every byte themselves, so gopacket stays an independent decoder
// of what they and the programs produce, and the checksum checks use their own RFC 1071
// arithmetic, shared with neither the programs nor gopacket.
package pktgen

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
)

// IP protocol numbers of the transports a Packet can carry.
const (
	ProtoICMPv4 = 1
	ProtoTCP    = 6
	ProtoUDP    = 17
	ProtoICMPv6 = 58
	ProtoSCTP   = 132
)

// SCTP chunk types (RFC 9260 §3.2) the tests send.
const (
	SCTPData             = 0
	SCTPInit             = 1
	SCTPInitAck          = 2
	SCTPSack             = 3
	SCTPHeartbeat        = 4
	SCTPAbort            = 6
	SCTPShutdown         = 7
	SCTPShutdownAck      = 8
	SCTPCookieEcho       = 10
	SCTPCookieAck        = 11
	SCTPShutdownComplete = 14
)

// SCTPChunk is one chunk of an SCTP packet: its value is padded to 4 bytes.
type SCTPChunk struct {
	Type, Flags uint8
	Value       []byte
}

// TCPFlags are the flags of a TCP header.
type TCPFlags uint8

// TCP flags.
const (
	FIN TCPFlags = 1 << iota
	SYN
	RST
	PSH
	ACK
)

// Default Ethernet addresses: locally administered, owned by no real host.
var (
	defaultSrcMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x10}
	defaultDstMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
)

// Packet describes a packet to build: an IPv4 or IPv6 packet (as Src is) carrying
// TCP, UDP or ICMP, and the Ethernet frame around it. Zero fields take defaults. The
// defaults of TTL, TOS, ID, flow label, sequence numbers and window are values no
// program writes on its own, so a test sees whether a program copied or rewrote them.
type Packet struct {
	// Ethernet.
	SrcMAC, DstMAC net.HardwareAddr // default 02:00:00:00:00:10 -> 02:00:00:00:00:01
	VLAN           uint16           // an 802.1Q tag with this VLAN ID, when not 0
	Pad            int              // bytes of Ethernet padding after the IP packet

	// IP.
	Src, Dst  netip.Addr
	TTL       uint8     // TTL or hop limit; default 60
	TOS       uint8     // TOS or traffic class; default 0x28
	ID        uint16    // IPv4 or IPv6 fragment identification; default 0x1234
	FlowLabel uint32    // IPv6 flow label; default 0x12345
	DF        bool      // IPv4 don't fragment
	IPOptions []byte    // IPv4 options, padded with zeros (end of options) to 4 bytes
	HopByHop  bool      // IPv6: an 8-byte hop-by-hop header (one PadN) first
	DestOpts  int       // IPv6: this many 8-byte destination-options headers, after hop-by-hop
	Fragment  *Fragment // makes the packet a fragment

	// Transport.
	Proto            uint8 // ProtoTCP (default), ProtoUDP, ProtoSCTP, ProtoICMPv4 or ProtoICMPv6
	SrcPort, DstPort uint16
	Flags            TCPFlags // default SYN
	Seq, Ack         uint32   // default 1000 and 5000
	Window           uint16   // default 512
	ICMPType         uint8
	ICMPCode         uint8
	ICMPRest         uint32 // the 4 bytes after the ICMP checksum: id and sequence, MTU...
	VTag             uint32 // SCTP verification tag
	Chunks           []SCTPChunk
	Payload          []byte // after the transport header (SCTP: after the chunks)

	// Knobs that break what is otherwise correct.
	NoUDPChecksum bool // UDP checksum 0: none, legal over IPv4 only
	BadIPChecksum bool // a wrong IPv4 header checksum
	BadL4Checksum bool // a wrong TCP, UDP, SCTP or ICMP checksum
}

// Fragment makes a packet a fragment: the flags and offset of an IPv4 header, or an
// IPv6 fragment header (after the hop-by-hop header, if any).
type Fragment struct {
	Offset uint16 // in 8-byte units
	More   bool   // more fragments follow
}

// Bytes returns n bytes of payload: a pattern, so that a byte moved or zeroed by a
// program shows.
func Bytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
	return b
}

func (p Packet) withDefaults() Packet {
	if p.SrcMAC == nil {
		p.SrcMAC = defaultSrcMAC
	}
	if p.DstMAC == nil {
		p.DstMAC = defaultDstMAC
	}
	if p.TTL == 0 {
		p.TTL = 60
	}
	if p.TOS == 0 {
		p.TOS = 0x28
	}
	if p.ID == 0 {
		p.ID = 0x1234
	}
	if p.FlowLabel == 0 {
		p.FlowLabel = 0x12345
	}
	if p.Proto == 0 {
		p.Proto = ProtoTCP
	}
	if p.Flags == 0 {
		p.Flags = SYN
	}
	if p.Seq == 0 {
		p.Seq = 1000
	}
	if p.Ack == 0 {
		p.Ack = 5000
	}
	if p.Window == 0 {
		p.Window = 512
	}
	return p
}

// Frame returns the Ethernet frame.
func (p Packet) Frame() []byte { return p.Wrap(p.IP()) }

// Wrap returns the Ethernet frame of p (addresses, VLAN tag, padding) around the IP
// packet ip, whose first nibble gives the EtherType.
func (p Packet) Wrap(ip []byte) []byte {
	p = p.withDefaults()
	f := append(append(make([]byte, 0, 18+len(ip)+p.Pad), p.DstMAC...), p.SrcMAC...)
	if p.VLAN != 0 {
		f = binary.BigEndian.AppendUint16(f, 0x8100)
		f = binary.BigEndian.AppendUint16(f, p.VLAN&0x0fff)
	}
	et := uint16(0x0800)
	if len(ip) > 0 && ip[0]>>4 == 6 {
		et = 0x86dd
	}
	f = binary.BigEndian.AppendUint16(f, et)
	f = append(f, ip...)
	return append(f, make([]byte, p.Pad)...)
}

// IP returns the IP packet alone: to encapsulate, to quote in an ICMP error, or to
// compare with what a program left.
func (p Packet) IP() []byte {
	p = p.withDefaults()
	if !p.Src.IsValid() || !p.Dst.IsValid() || p.Src.Is4() != p.Dst.Is4() {
		panic(fmt.Sprintf("pktgen: addresses %v -> %v are not one family", p.Src, p.Dst))
	}
	l4 := p.transport()
	var ip []byte
	if p.Src.Is4() {
		ip = p.ipv4Header(len(l4))
	} else {
		ip = p.ipv6Header(len(l4))
	}
	hl := len(ip)
	ip = append(ip, l4...)
	p.fillL4Checksum(ip[hl:])
	return ip
}

func (p Packet) ipv4Header(l4len int) []byte {
	opts := append([]byte(nil), p.IPOptions...)
	for len(opts)%4 != 0 {
		opts = append(opts, 0)
	}
	h := make([]byte, 20, 20+len(opts))
	h[0] = 0x40 | byte((20+len(opts))/4)
	h[1] = p.TOS
	binary.BigEndian.PutUint16(h[2:], uint16(20+len(opts)+l4len))
	binary.BigEndian.PutUint16(h[4:], p.ID)
	var frag uint16
	if p.DF {
		frag |= 0x4000
	}
	if f := p.Fragment; f != nil {
		frag |= f.Offset & 0x1fff
		if f.More {
			frag |= 0x2000
		}
	}
	binary.BigEndian.PutUint16(h[6:], frag)
	h[8], h[9] = p.TTL, p.Proto
	copy(h[12:], p.Src.AsSlice())
	copy(h[16:], p.Dst.AsSlice())
	h = append(h, opts...)
	cs := checksum(h)
	if p.BadIPChecksum {
		cs = spoil(cs)
	}
	binary.BigEndian.PutUint16(h[10:], cs)
	return h
}

func (p Packet) ipv6Header(l4len int) []byte {
	h := make([]byte, 40, 56)
	binary.BigEndian.PutUint32(h, 6<<28|uint32(p.TOS)<<20|p.FlowLabel&0xfffff)
	copy(h[8:], p.Src.AsSlice())
	copy(h[24:], p.Dst.AsSlice())
	// Each header names the next: next points at the byte to fill.
	next := 6
	if p.HopByHop {
		h[next], next = 0, len(h)
		h = append(h, 0, 0, 1, 4, 0, 0, 0, 0) // length 0 (8 bytes): PadN of 4 bytes
	}
	for range p.DestOpts {
		h[next], next = 60, len(h)
		h = append(h, 0, 0, 1, 4, 0, 0, 0, 0)
	}
	if f := p.Fragment; f != nil {
		fo := f.Offset << 3
		if f.More {
			fo |= 1
		}
		h[next], next = 44, len(h)
		h = append(h, 0, 0, byte(fo>>8), byte(fo))
		h = binary.BigEndian.AppendUint32(h, uint32(p.ID))
	}
	h[next] = p.Proto
	binary.BigEndian.PutUint16(h[4:], uint16(len(h)-40+l4len))
	h[7] = p.TTL
	return h
}

// transport returns the transport header and payload, checksum field zero.
func (p Packet) transport() []byte {
	var h []byte
	switch p.Proto {
	case ProtoTCP:
		h = make([]byte, 20)
		binary.BigEndian.PutUint16(h[0:], p.SrcPort)
		binary.BigEndian.PutUint16(h[2:], p.DstPort)
		binary.BigEndian.PutUint32(h[4:], p.Seq)
		binary.BigEndian.PutUint32(h[8:], p.Ack)
		h[12], h[13] = 5<<4, byte(p.Flags)
		binary.BigEndian.PutUint16(h[14:], p.Window)
	case ProtoUDP:
		h = make([]byte, 8)
		binary.BigEndian.PutUint16(h[0:], p.SrcPort)
		binary.BigEndian.PutUint16(h[2:], p.DstPort)
		binary.BigEndian.PutUint16(h[4:], uint16(8+len(p.Payload)))
	case ProtoICMPv4, ProtoICMPv6:
		h = make([]byte, 8)
		h[0], h[1] = p.ICMPType, p.ICMPCode
		binary.BigEndian.PutUint32(h[4:], p.ICMPRest)
	case ProtoSCTP:
		h = make([]byte, 12)
		binary.BigEndian.PutUint16(h[0:], p.SrcPort)
		binary.BigEndian.PutUint16(h[2:], p.DstPort)
		binary.BigEndian.PutUint32(h[4:], p.VTag)
		for _, c := range p.Chunks {
			h = append(h, c.Type, c.Flags, 0, 0)
			binary.BigEndian.PutUint16(h[len(h)-2:], uint16(4+len(c.Value)))
			h = append(h, c.Value...)
			h = append(h, make([]byte, -len(c.Value)&3)...)
		}
	default:
		panic(fmt.Sprintf("pktgen: cannot build protocol %d", p.Proto))
	}
	return append(h, p.Payload...)
}

func (p Packet) fillL4Checksum(l4 []byte) {
	if p.Proto == ProtoSCTP {
		SetSCTPChecksum(l4)
		if p.BadL4Checksum {
			l4[8] ^= 1
		}
		return
	}
	off := map[uint8]int{ProtoTCP: 16, ProtoUDP: 6, ProtoICMPv4: 2, ProtoICMPv6: 2}[p.Proto]
	var cs uint16
	if p.Proto == ProtoICMPv4 {
		cs = checksum(l4)
	} else {
		cs = checksum(pseudoHeader(p.Src, p.Dst, p.Proto, len(l4)), l4)
	}
	if p.Proto == ProtoUDP && cs == 0 {
		cs = 0xffff // 0 would mean "no checksum" (RFC 768)
	}
	switch {
	case p.NoUDPChecksum && p.Proto == ProtoUDP:
		cs = 0
	case p.BadL4Checksum:
		cs = spoil(cs)
	}
	binary.BigEndian.PutUint16(l4[off:], cs)
}

// spoil turns a correct checksum into a wrong one that is not 0 either (0 and 0xffff
// are the same number in ones' complement, and a UDP checksum of 0 means none).
func spoil(sum uint16) uint16 {
	if sum == 0xffff {
		return 1
	}
	return sum + 1
}

// ARPRequest returns a broadcast ARP request from (mac, src) for target.
func ARPRequest(mac net.HardwareAddr, src, target netip.Addr) []byte {
	f := append(append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, mac...), 0x08, 0x06)
	f = append(f, 0, 1, 0x08, 0, 6, 4, 0, 1) // Ethernet, IPv4, sizes, request
	f = append(append(f, mac...), src.AsSlice()...)
	return append(append(f, make([]byte, 6)...), target.AsSlice()...)
}
