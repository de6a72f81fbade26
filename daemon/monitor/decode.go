package monitor

import (
	"encoding/binary"
	"net/netip"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// Flow is what the first bytes of a reported packet say about the client's flow.
type Flow struct {
	// Client and Destination (a VIP and port, for traffic to a service); invalid where
	// the bytes do not say.
	Client, Destination netip.AddrPort
	// Proto is the IP protocol number; 0 when unknown.
	Proto uint8
	// Backend is where a forwarded packet was sent (its inner destination).
	Backend netip.AddrPort
}

// DSR option of lbd's Geneve header (docs/wire-format.md).
const (
	dsrClass = 0x014B
	dsrType  = 0x81
)

// Decode reads the client's flow from a frame as the datapath left it (Ethernet first):
// a packet as it arrived; an encapsulated one, whose client is the inner source and
// whose destination is the VIP and port of its DSR option; or an answer the node sent
// back (answered true): a TCP reset, whose destination is the client, or an ICMP
// error, which quotes the client's packet.
func Decode(frame []byte, answered bool) Flow {
	p := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.DecodeOptions{Lazy: true, NoCopy: true})
	var f Flow
	if g, ok := p.Layer(layers.LayerTypeGeneve).(*layers.Geneve); ok {
		return decodeEncapsulated(p, g)
	}
	src, dst, proto, l4, ok := network(p)
	if !ok {
		return f
	}
	if answered {
		switch proto {
		case uint8(layers.IPProtocolICMPv4):
			if ic, ok := p.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4); ok {
				return quoted(ic.Payload, layers.LayerTypeIPv4)
			}
		case uint8(layers.IPProtocolICMPv6):
			// The ICMPv6 layer's payload starts with 4 bytes of the message (the MTU of
			// a packet too big, unused otherwise) before the quoted packet.
			if ic, ok := p.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6); ok && len(ic.Payload) > 4 {
				return quoted(ic.Payload[4:], layers.LayerTypeIPv6)
			}
		default:
			src, dst = dst, src
			l4 = swapPorts(l4)
		}
	}
	f.Proto = proto
	f.Client, f.Destination = withPorts(src, dst, proto, l4)
	return f
}

// network returns a packet's addresses, protocol and the bytes after its IP header.
func network(p gopacket.Packet) (src, dst netip.Addr, proto uint8, l4 []byte, ok bool) {
	switch ip := p.NetworkLayer().(type) {
	case *layers.IPv4:
		src, _ = netip.AddrFromSlice(ip.SrcIP.To4())
		dst, _ = netip.AddrFromSlice(ip.DstIP.To4())
		return src, dst, uint8(ip.Protocol), ip.Payload, true
	case *layers.IPv6:
		src, _ = netip.AddrFromSlice(ip.SrcIP)
		dst, _ = netip.AddrFromSlice(ip.DstIP)
		proto = uint8(ip.NextHeader)
		// The layer after extension headers, when gopacket followed them.
		if t := p.TransportLayer(); t != nil {
			proto = transportProto(t, proto)
			return src, dst, proto, t.LayerContents(), true
		}
		return src, dst, proto, ip.Payload, true
	}
	return src, dst, 0, nil, false
}

func transportProto(t gopacket.TransportLayer, def uint8) uint8 {
	switch t.(type) {
	case *layers.TCP:
		return uint8(layers.IPProtocolTCP)
	case *layers.UDP:
		return uint8(layers.IPProtocolUDP)
	case *layers.SCTP:
		return uint8(layers.IPProtocolSCTP)
	}
	return def
}

// hasPorts reports whether the protocol's header starts with source and destination ports.
func hasPorts(proto uint8) bool {
	return proto == uint8(layers.IPProtocolTCP) || proto == uint8(layers.IPProtocolUDP) || proto == uint8(layers.IPProtocolSCTP)
}

func withPorts(src, dst netip.Addr, proto uint8, l4 []byte) (netip.AddrPort, netip.AddrPort) {
	var sp, dp uint16
	if hasPorts(proto) && len(l4) >= 4 {
		sp, dp = binary.BigEndian.Uint16(l4), binary.BigEndian.Uint16(l4[2:])
	}
	return netip.AddrPortFrom(src, sp), netip.AddrPortFrom(dst, dp)
}

func swapPorts(l4 []byte) []byte {
	if len(l4) < 4 {
		return l4
	}
	out := append([]byte(nil), l4[:4]...)
	copy(out, l4[2:4])
	copy(out[2:], l4[0:2])
	return out
}

// quoted decodes the client's packet an ICMP error quotes (its IP header and the first
// bytes after it): the flow is that packet's.
func quoted(b []byte, first gopacket.LayerType) Flow {
	p := gopacket.NewPacket(b, first, gopacket.DecodeOptions{Lazy: true, NoCopy: true})
	src, dst, proto, l4, ok := network(p)
	if !ok {
		return Flow{}
	}
	f := Flow{Proto: proto}
	f.Client, f.Destination = withPorts(src, dst, proto, l4)
	return f
}

// decodeEncapsulated reads a forwarded packet: the client from the inner packet, the
// backend from its destination, the VIP and port from the DSR option.
func decodeEncapsulated(p gopacket.Packet, g *layers.Geneve) Flow {
	var f Flow
	inner := gopacket.NewPacket(g.Payload, layers.LayerTypeEthernet, gopacket.DecodeOptions{Lazy: true, NoCopy: true})
	if src, dst, proto, l4, ok := network(inner); ok {
		f.Proto = proto
		f.Client, f.Backend = withPorts(src, dst, proto, l4)
	}
	for _, o := range g.Options {
		if o.Class != dsrClass || o.Type != dsrType {
			continue
		}
		var vip netip.Addr
		switch len(o.Data) {
		case 8:
			vip = netip.AddrFrom4([4]byte(o.Data[:4]))
		case 20:
			vip = netip.AddrFrom16([16]byte(o.Data[:16]))
		default:
			continue
		}
		f.Destination = netip.AddrPortFrom(vip, binary.BigEndian.Uint16(o.Data[len(o.Data)-4:]))
	}
	return f
}
