//go:build linux

package backendtc

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/lbd-dev/lbd/internal/testnet"
)

// Addresses of the test world: LB nodes in 198.18.0.0/24 and 2001:db8:1::/64 are
// allowed; everything stays inside BPF_PROG_TEST_RUN or the test's namespaces.
var (
	lbMAC   = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	nodeMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}

	allowedV4 = netip.MustParsePrefix("198.18.0.0/24")
	allowedV6 = netip.MustParsePrefix("2001:db8:1::/64")

	lbV4       = netip.MustParseAddr("198.18.0.1")
	lbV6       = netip.MustParseAddr("2001:db8:1::1")
	strangerV4 = netip.MustParseAddr("198.18.9.9")
	strangerV6 = netip.MustParseAddr("2001:db8:9::9")
	nodeV4     = netip.MustParseAddr("198.18.1.2")
	nodeV6     = netip.MustParseAddr("2001:db8:2::2")
	routerV4   = netip.MustParseAddr("198.18.1.254")

	clientV4  = netip.MustParseAddrPort("198.19.5.5:40000")
	backendV4 = netip.MustParseAddrPort("198.18.1.2:8080")
	vipV4     = netip.MustParseAddrPort("203.0.113.10:80")
	vip2V4    = netip.MustParseAddrPort("203.0.113.11:443")
	clientV6  = netip.MustParseAddrPort("[2001:db8:c::5]:40000")
	backendV6 = netip.MustParseAddrPort("[2001:db8:2::2]:8080")
	vipV6     = netip.MustParseAddrPort("[2001:db8:f::10]:80")
)

const (
	verdictNext = ^uint32(0) // TCX_NEXT (-1)
	verdictDrop = 2          // TCX_DROP
)

// newDatapath loads a private datapath (no pinning) with the test's LB prefixes
// allowed.
func newDatapath(tb testing.TB) *Datapath {
	tb.Helper()
	testnet.Require(tb)
	d, err := Load(Options{NATMaxEntries: 1024})
	if err != nil {
		tb.Fatalf("load: %v", err)
	}
	tb.Cleanup(func() { d.Close() })
	for _, p := range []netip.Prefix{allowedV4, allowedV6} {
		if err := d.AddAllowedSource(p); err != nil {
			tb.Fatal(err)
		}
	}
	return d
}

// run feeds one frame to prog through BPF_PROG_TEST_RUN.
func run(tb testing.TB, prog *ebpf.Program, frame []byte) (uint32, []byte) {
	tb.Helper()
	opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+512)}
	ret, err := prog.Run(&opts)
	if err != nil {
		tb.Fatalf("run %s: %v", prog, err)
	}
	return ret, opts.DataOut
}

// tcpFlags selects the flags of a test TCP segment.
type tcpFlags struct{ SYN, ACK, FIN, RST bool }

// flow describes a client→backend packet (as the LB forwards it, already DNAT'ed) or
// its backend→client reply.
type flow struct {
	proto   layers.IPProtocol
	client  netip.AddrPort
	backend netip.AddrPort
	flags   tcpFlags
	payload []byte
}

func ipLayer(src, dst netip.Addr, proto layers.IPProtocol) gopacket.NetworkLayer {
	if src.Is4() {
		return &layers.IPv4{Version: 4, TTL: 64, Id: 0x1234, Protocol: proto,
			SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	}
	return &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: proto,
		SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
}

// l4Packet serializes an IP packet with correct checksums (computed by gopacket).
func l4Packet(tb testing.TB, proto layers.IPProtocol, src, dst netip.AddrPort, flags tcpFlags,
	payload []byte) []byte {
	tb.Helper()
	ip := ipLayer(src.Addr(), dst.Addr(), proto)
	var l4 gopacket.SerializableLayer
	switch proto {
	case layers.IPProtocolTCP:
		tcp := &layers.TCP{SrcPort: layers.TCPPort(src.Port()), DstPort: layers.TCPPort(dst.Port()),
			Seq: 1000, Ack: 2000, Window: 65535,
			SYN: flags.SYN, ACK: flags.ACK, FIN: flags.FIN, RST: flags.RST}
		tcp.SetNetworkLayerForChecksum(ip)
		l4 = tcp
	case layers.IPProtocolUDP:
		udp := &layers.UDP{SrcPort: layers.UDPPort(src.Port()), DstPort: layers.UDPPort(dst.Port())}
		udp.SetNetworkLayerForChecksum(ip)
		l4 = udp
	case layers.IPProtocolICMPv4:
		l4 = &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0),
			Id: 7, Seq: 1}
	default:
		tb.Fatalf("unsupported protocol %v", proto)
	}
	return serialize(tb, ip.(gopacket.SerializableLayer), l4, gopacket.Payload(payload))
}

func serialize(tb testing.TB, ls ...gopacket.SerializableLayer) []byte {
	tb.Helper()
	buf := gopacket.NewSerializeBuffer()
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	if err := gopacket.SerializeLayers(buf, opts, ls...); err != nil {
		tb.Fatalf("serialize: %v", err)
	}
	return append([]byte(nil), buf.Bytes()...)
}

// request is the IP packet the LB forwards: client → backend.
func (f flow) request(tb testing.TB) []byte {
	return l4Packet(tb, f.proto, f.client, f.backend, f.flags, f.payload)
}

// reply is the backend's answer as an Ethernet frame, as the egress hook sees it.
func (f flow) reply(tb testing.TB) []byte {
	return ethFrame(nodeMAC, lbMAC, l4Packet(tb, f.proto, f.backend, f.client, f.flags, f.payload))
}

// original is what the client really sent: client → VIP.
func (f flow) original(tb testing.TB, vip netip.AddrPort) []byte {
	return l4Packet(tb, f.proto, f.client, vip, f.flags, f.payload)
}

func ethType(ip []byte) uint16 {
	if len(ip) > 0 && ip[0]>>4 == 6 {
		return 0x86dd
	}
	return 0x0800
}

func ethFrame(src, dst net.HardwareAddr, ip []byte) []byte {
	f := make([]byte, 14, 14+len(ip))
	copy(f[0:6], dst)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:14], ethType(ip))
	return append(f, ip...)
}

// geneveOpt is one raw Geneve option: class, type, then data (a multiple of 4 bytes).
func geneveOpt(class uint16, typ uint8, data []byte) []byte {
	o := []byte{byte(class >> 8), byte(class), typ, byte(len(data) / 4)}
	return append(o, data...)
}

// dsrOpt is lbd's DSR option (DESIGN.md §2) for vip.
func dsrOpt(vip netip.AddrPort) []byte {
	data := vip.Addr().AsSlice()
	data = binary.BigEndian.AppendUint16(data, vip.Port())
	data = append(data, 0, 0)
	return geneveOpt(0x014B, 0x81, data)
}

// encap describes the outer headers an LB node adds.
type encap struct {
	src, dst netip.Addr
	vni      uint32
	opts     []byte // raw options; the Geneve header's length field follows them
	mutate   func(frame []byte)
	// Outer Ethernet addresses; lbMAC and nodeMAC when nil.
	srcMAC, dstMAC net.HardwareAddr
}

// frame wraps an IP packet in an inner Ethernet header, Geneve, UDP, IP and Ethernet.
func (e encap) frame(tb testing.TB, inner []byte) []byte {
	tb.Helper()
	gen := make([]byte, 8, 8+len(e.opts))
	gen[0] = byte(len(e.opts) / 4)
	binary.BigEndian.PutUint16(gen[2:4], 0x6558)
	gen[4], gen[5], gen[6] = byte(e.vni>>16), byte(e.vni>>8), byte(e.vni)
	gen = append(gen, e.opts...)
	gen = append(gen, ethFrame(lbMAC, nodeMAC, inner)...)

	ip := ipLayer(e.src, e.dst, layers.IPProtocolUDP)
	udp := &layers.UDP{SrcPort: 49152, DstPort: 6081}
	udp.SetNetworkLayerForChecksum(ip)
	eth := &layers.Ethernet{SrcMAC: lbMAC, DstMAC: nodeMAC, EthernetType: layers.EthernetTypeIPv4}
	if e.srcMAC != nil {
		eth.SrcMAC, eth.DstMAC = e.srcMAC, e.dstMAC
	}
	if e.src.Is6() {
		eth.EthernetType = layers.EthernetTypeIPv6
	}
	f := serialize(tb, eth, ip.(gopacket.SerializableLayer), udp, gopacket.Payload(gen))
	if e.mutate != nil {
		e.mutate(f)
	}
	return f
}

// outerLen is the size of outer Ethernet + IP + UDP for an underlay family.
func outerLen(src netip.Addr) int {
	if src.Is4() {
		return 14 + 20 + 8
	}
	return 14 + 40 + 8
}

// ---- Independent checksum verification (RFC 1071), not shared with the datapath.

func sum16(b []byte, s uint32) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	return s
}

func fold(s uint32) uint16 {
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// pseudoSum is the checksum pseudo-header of an IP packet for its L4 payload.
func pseudoSum(ip []byte, proto byte, l4len int) uint32 {
	var s uint32
	if ip[0]>>4 == 4 {
		s = sum16(ip[12:20], 0)
	} else {
		s = sum16(ip[8:40], 0)
	}
	return s + uint32(proto) + uint32(l4len)
}

// checkIPPacket verifies every checksum of an IP packet (IPv4 header, TCP, UDP,
// ICMP, ICMPv6) by recomputing it; it returns a description of the first bad one.
func checkIPPacket(ip []byte) error {
	var (
		proto byte
		l4    []byte
	)
	switch ip[0] >> 4 {
	case 4:
		hl := int(ip[0]&0x0f) * 4
		tot := int(binary.BigEndian.Uint16(ip[2:4]))
		if len(ip) < tot || tot < hl {
			return fmt.Errorf("IPv4 total length %d, have %d bytes", tot, len(ip))
		}
		if got := fold(sum16(ip[:hl], 0)); got != 0xffff {
			return fmt.Errorf("IPv4 header checksum: sum %#04x", got)
		}
		proto, l4 = ip[9], ip[hl:tot]
	case 6:
		plen := int(binary.BigEndian.Uint16(ip[4:6]))
		if len(ip) < 40+plen {
			return fmt.Errorf("IPv6 payload length %d, have %d bytes", plen, len(ip)-40)
		}
		proto, l4 = ip[6], ip[40:40+plen]
	default:
		return fmt.Errorf("IP version %d", ip[0]>>4)
	}
	switch proto {
	case 6, 17, 58:
		if proto == 17 && ip[0]>>4 == 4 && binary.BigEndian.Uint16(l4[6:8]) == 0 {
			return nil // no UDP checksum over IPv4
		}
		if got := fold(sum16(l4, pseudoSum(ip, proto, len(l4)))); got != 0xffff {
			return fmt.Errorf("protocol %d checksum: sum %#04x", proto, got)
		}
	case 1:
		if got := fold(sum16(l4, 0)); got != 0xffff {
			return fmt.Errorf("ICMP checksum: sum %#04x", got)
		}
	}
	return nil
}
