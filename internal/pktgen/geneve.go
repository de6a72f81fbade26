package pktgen

import (
	"encoding/binary"
	"net/netip"
)

// lbd's Geneve encapsulation (docs/wire-format.md).
const (
	GenevePort      = 6081   // UDP destination port
	GeneveEthernet  = 0x6558 // protocol type: an Ethernet frame follows
	DSRClass        = 0x014B // option class of the DSR option
	DSRType         = 0x81   // option type of the DSR option, critical bit set
	geneveSrcPort   = 49152  // outer UDP source port unless the test sets one
	geneveCritical  = 0x80   // critical bit of an option type
	geneveFlagC     = 0x40   // header flag: an option is critical
	geneveFlagOAM   = 0x80   // header flag: a control packet
	geneveMaxOptLen = 0x3f   // the options length field is 6 bits of 4-byte words
)

// GeneveOption is one Geneve option.
type GeneveOption struct {
	Class uint16
	Type  uint8
	Data  []byte // a multiple of 4 bytes
	// Len, when not 0, replaces the length field (4-byte words of data) to make the
	// option disagree with its data.
	Len uint8
}

// DSROption is lbd's DSR option for a service: the VIP, its port (0 for a service of
// every port), then 2 zero bytes.
func DSROption(vip netip.AddrPort) GeneveOption {
	data := binary.BigEndian.AppendUint16(vip.Addr().AsSlice(), vip.Port())
	return GeneveOption{Class: DSRClass, Type: DSRType, Data: append(data, 0, 0)}
}

// Geneve describes the encapsulation an LB node adds around an IP packet: outer
// Ethernet, IP and UDP to port 6081, the Geneve header and options, and an inner
// Ethernet header with Packet's default addresses.
type Geneve struct {
	// Outer gives the outer Ethernet and IP headers and their knobs. Frame makes it a
	// UDP packet to port 6081 (unless DstPort is set) from port 49152 (unless SrcPort
	// is set) with the Geneve payload.
	Outer   Packet
	VNI     uint32
	Options []GeneveOption

	// Knobs that break a correct header.
	Version  uint8  // 0 is the only version
	OAM      bool   // mark a control packet
	Protocol uint16 // protocol type; GeneveEthernet when 0
	OptLen   uint8  // options length field in 4-byte words; computed when 0
}

// Header returns the Geneve header and its options.
func (g Geneve) Header() []byte {
	var opts []byte
	critical := false
	for _, o := range g.Options {
		n := o.Len
		if n == 0 {
			n = uint8(len(o.Data) / 4)
		}
		opts = binary.BigEndian.AppendUint16(opts, o.Class)
		opts = append(append(opts, o.Type, n&0x1f), o.Data...)
		critical = critical || o.Type&geneveCritical != 0
	}
	optLen := g.OptLen
	if optLen == 0 {
		optLen = uint8(len(opts) / 4)
	}
	h := []byte{g.Version<<6 | optLen&geneveMaxOptLen, 0, 0, 0}
	if critical {
		h[1] |= geneveFlagC
	}
	if g.OAM {
		h[1] |= geneveFlagOAM
	}
	proto := g.Protocol
	if proto == 0 {
		proto = GeneveEthernet
	}
	binary.BigEndian.PutUint16(h[2:], proto)
	h = binary.BigEndian.AppendUint32(h, g.VNI<<8)
	return append(h, opts...)
}

// Frame returns the encapsulated frame of the IP packet inner.
func (g Geneve) Frame(inner []byte) []byte {
	o := g.Outer
	o.Proto = ProtoUDP
	if o.SrcPort == 0 {
		o.SrcPort = geneveSrcPort
	}
	if o.DstPort == 0 {
		o.DstPort = GenevePort
	}
	o.Payload = append(g.Header(), Packet{}.Wrap(inner)...)
	return o.Frame()
}
