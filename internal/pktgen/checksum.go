package pktgen

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net/netip"
)

// sum is the ones' complement sum of b (RFC 1071), folded to 16 bits.
func sum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// checksum is the Internet checksum of the concatenation of parts: the ones'
// complement of their ones' complement sum.
func checksum(parts ...[]byte) uint16 {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return ^sum(b)
}

// pseudoHeader is what TCP, UDP and ICMPv6 checksums cover before the segment.
func pseudoHeader(src, dst netip.Addr, proto uint8, n int) []byte {
	ph := append(src.AsSlice(), dst.AsSlice()...)
	if src.Is4() {
		return append(ph, 0, proto, byte(n>>8), byte(n))
	}
	ph = binary.BigEndian.AppendUint32(ph, uint32(n))
	return append(ph, 0, 0, 0, proto)
}

// IPv4HeaderOK reports whether the checksum of an IPv4 header verifies.
func IPv4HeaderOK(hdr []byte) bool { return sum(hdr) == 0xffff }

// l4ChecksumOK reports whether the checksum of a TCP, UDP, ICMP or ICMPv6 segment
// from src to dst verifies (ICMP over IPv4 has no pseudo-header).
func l4ChecksumOK(src, dst netip.Addr, proto uint8, seg []byte) bool {
	if proto == ProtoICMPv4 {
		return sum(seg) == 0xffff
	}
	return sum(append(pseudoHeader(src, dst, proto, len(seg)), seg...)) == 0xffff
}

// ipPacket is an IP packet taken apart by offsets, for the checksum checks.
type ipPacket struct {
	src, dst netip.Addr
	hdr      []byte // the IPv4 header, or the IPv6 header and its extension headers
	proto    uint8
	l4       []byte // to the end of the IP packet, Ethernet padding excluded
	fragment bool   // not the whole datagram: its transport checksum cannot be checked
}

// parseIP finds the transport of an IPv4 or IPv6 packet, behind any IPv6 extension
// headers.
func parseIP(ip []byte) (ipPacket, error) {
	var p ipPacket
	if len(ip) == 0 {
		return p, errors.New("empty IP packet")
	}
	switch ip[0] >> 4 {
	case 4:
		if len(ip) < 20 {
			return p, fmt.Errorf("IPv4 header cut at %d bytes", len(ip))
		}
		hl, tot := int(ip[0]&0x0f)*4, int(binary.BigEndian.Uint16(ip[2:]))
		if hl < 20 || tot < hl || tot > len(ip) {
			return p, fmt.Errorf("IPv4 header length %d, total length %d, %d bytes", hl, tot, len(ip))
		}
		p.src, p.dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
		p.hdr, p.proto, p.l4 = ip[:hl], ip[9], ip[hl:tot]
		p.fragment = binary.BigEndian.Uint16(ip[6:])&0x3fff != 0
	case 6:
		if len(ip) < 40 {
			return p, fmt.Errorf("IPv6 header cut at %d bytes", len(ip))
		}
		end := 40 + int(binary.BigEndian.Uint16(ip[4:]))
		if end > len(ip) {
			return p, fmt.Errorf("IPv6 payload length %d, %d bytes", end-40, len(ip)-40)
		}
		p.src, p.dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
		off, proto := 40, ip[6]
		for proto == 0 || proto == 43 || proto == 44 || proto == 60 {
			if off+8 > end {
				return p, fmt.Errorf("IPv6 extension header %d cut", proto)
			}
			n := (int(ip[off+1]) + 1) * 8
			if proto == 44 {
				n, p.fragment = 8, binary.BigEndian.Uint16(ip[off+2:])&0xfff9 != 0
			}
			proto, off = ip[off], off+n
		}
		if off > end {
			return p, errors.New("IPv6 extension headers beyond the payload")
		}
		p.hdr, p.proto, p.l4 = ip[:off], proto, ip[off:end]
	default:
		return p, fmt.Errorf("IP version %d", ip[0]>>4)
	}
	return p, nil
}

// VerifyIP recomputes every checksum of an IP packet (IPv4 header, TCP, UDP, SCTP,
// ICMP, ICMPv6) and describes the first that is wrong. A UDP checksum of 0 over IPv4 means
// none and passes; over IPv6 it is an error. A fragment has only its IPv4 header
// checked.
func VerifyIP(ip []byte) error {
	p, err := parseIP(ip)
	if err != nil {
		return err
	}
	if p.src.Is4() && !IPv4HeaderOK(p.hdr) {
		return fmt.Errorf("IPv4 header checksum %#04x does not verify", binary.BigEndian.Uint16(p.hdr[10:]))
	}
	if p.fragment {
		return nil
	}
	if p.proto == ProtoSCTP {
		if len(p.l4) < 12 {
			return fmt.Errorf("SCTP header cut at %d bytes", len(p.l4))
		}
		if got, want := binary.LittleEndian.Uint32(p.l4[8:]), SCTPChecksum(p.l4); got != want {
			return fmt.Errorf("SCTP CRC32c %#08x does not verify (want %#08x)", got, want)
		}
		return nil
	}
	off, ok := map[uint8]int{ProtoTCP: 16, ProtoUDP: 6, ProtoICMPv4: 2, ProtoICMPv6: 2}[p.proto]
	if !ok {
		return nil
	}
	if len(p.l4) < off+2 {
		return fmt.Errorf("protocol %d header cut at %d bytes", p.proto, len(p.l4))
	}
	got := binary.BigEndian.Uint16(p.l4[off:])
	if p.proto == ProtoUDP && got == 0 {
		if p.src.Is4() {
			return nil
		}
		return errors.New("UDP checksum 0 over IPv6")
	}
	if !l4ChecksumOK(p.src, p.dst, p.proto, p.l4) {
		return fmt.Errorf("protocol %d checksum %#04x does not verify", p.proto, got)
	}
	return nil
}

// castagnoli is the CRC32c table of SCTP's checksum (RFC 9260 Appendix B).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// SCTPChecksum computes the CRC32c of an SCTP packet (common header and chunks) with
// its checksum field taken as zero. It covers no IP pseudo-header.
func SCTPChecksum(sctp []byte) uint32 {
	h := crc32.Update(0, castagnoli, sctp[:8])
	h = crc32.Update(h, castagnoli, []byte{0, 0, 0, 0})
	return crc32.Update(h, castagnoli, sctp[12:])
}

// SetSCTPChecksum writes an SCTP packet's CRC32c, in the byte order SCTP puts it.
func SetSCTPChecksum(sctp []byte) {
	binary.LittleEndian.PutUint32(sctp[8:], SCTPChecksum(sctp))
}

// VerifyPartial checks a TCP or UDP packet whose checksum the sender left to the NIC
// (CHECKSUM_PARTIAL): its checksum field must hold the folded pseudo-header sum of the
// packet's own addresses, which the NIC or the stack completes later.
func VerifyPartial(ip []byte) error {
	p, err := parseIP(ip)
	if err != nil {
		return err
	}
	if p.src.Is4() && !IPv4HeaderOK(p.hdr) {
		return fmt.Errorf("IPv4 header checksum %#04x does not verify", binary.BigEndian.Uint16(p.hdr[10:]))
	}
	off := map[uint8]int{ProtoTCP: 16, ProtoUDP: 6}[p.proto]
	if off == 0 || len(p.l4) < off+2 {
		return fmt.Errorf("not a whole TCP or UDP header: protocol %d, %d bytes", p.proto, len(p.l4))
	}
	want := sum(pseudoHeader(p.src, p.dst, p.proto, len(p.l4)))
	if got := binary.BigEndian.Uint16(p.l4[off:]); got != want {
		return fmt.Errorf("partial checksum seed %#04x, want the pseudo-header sum %#04x", got, want)
	}
	return nil
}
