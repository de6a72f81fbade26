package pktgen

import (
	"encoding/binary"
	"slices"
)

// Offsets says where the headers of a frame start, so that a test breaking one field
// on purpose names it (at.L4+12: TCP's data offset) instead of counting bytes. The
// offset of a header the frame lacks is 0.
type Offsets struct {
	L3, L4 int // IP header; transport header, behind any IPv6 extension headers
	// Of a Geneve frame: its header, and the inner frame's IP and transport headers.
	Geneve, InnerL3, InnerL4 int
}

// Locate finds the headers of a frame as the builders of this package write them:
// Ethernet with at most one VLAN tag, IPv4 or IPv6, and Geneve to port 6081.
func Locate(frame []byte) Offsets {
	var at Offsets
	if len(frame) < 14 {
		return at
	}
	at.L3 = 14
	if binary.BigEndian.Uint16(frame[12:]) == 0x8100 {
		at.L3 = 18
	}
	if at.L3 >= len(frame) {
		return at
	}
	p, err := parseIP(frame[at.L3:])
	if err != nil {
		return at
	}
	at.L4 = at.L3 + len(p.hdr)
	if p.proto != ProtoUDP || len(p.l4) < 16 || binary.BigEndian.Uint16(p.l4[2:]) != GenevePort {
		return at
	}
	at.Geneve = at.L4 + 8
	innerEth := at.Geneve + 8 + int(frame[at.Geneve]&geneveMaxOptLen)*4
	if innerEth >= len(frame) {
		return at
	}
	in := Locate(frame[innerEth:])
	if in.L3 != 0 {
		at.InnerL3 = innerEth + in.L3
	}
	if in.L4 != 0 {
		at.InnerL4 = innerEth + in.L4
	}
	return at
}

// Edit returns a copy of frame changed by fn, which gets the copy and where its
// headers are. Checksums stay as they were.
func Edit(frame []byte, fn func(b []byte, at Offsets)) []byte {
	b := slices.Clone(frame)
	fn(b, Locate(b))
	return b
}
