//go:build linux

package backendtc

import (
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/lbd-dev/lbd/internal/pktgen"
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
	return pktgen.Prog{Program: prog}.Run(tb, frame)
}

// flow is a client's conversation with a backend: its requests as the LB forwards
// them (already DNAT'ed), and the backend's replies.
type flow struct {
	proto   uint8 // pktgen.ProtoTCP, ProtoUDP, ProtoSCTP, or ProtoICMPv4 for an echo request
	client  netip.AddrPort
	backend netip.AddrPort
	flags   pktgen.TCPFlags
	chunk   uint8 // SCTP: the type of the packet's one chunk, whose value is payload
	payload []byte
}

func (f flow) packet(src, dst netip.AddrPort) pktgen.Packet {
	p := pktgen.Packet{Src: src.Addr(), Dst: dst.Addr(), SrcPort: src.Port(), DstPort: dst.Port(), Proto: f.proto,
		Flags: f.flags, Payload: f.payload}
	switch f.proto {
	case pktgen.ProtoICMPv4:
		p.ICMPType, p.ICMPRest = 8, 7<<16|1 // echo request, id 7, sequence 1
	case pktgen.ProtoSCTP:
		p.VTag, p.Payload = 0x5c7b0001, nil
		p.Chunks = []pktgen.SCTPChunk{{Type: f.chunk, Value: f.payload}}
	}
	return p
}

// request is the IP packet the LB forwards: client -> backend.
func (f flow) request() []byte { return f.packet(f.client, f.backend).IP() }

// original is the IP packet the client really sent: client -> VIP.
func (f flow) original(vip netip.AddrPort) []byte { return f.packet(f.client, vip).IP() }

// reply is the backend's answer from src (its own address, or the VIP once SNAT'ed)
// as the egress hook sees it.
func (f flow) reply(src netip.AddrPort) pktgen.Packet {
	p := f.packet(src, f.client)
	p.SrcMAC, p.DstMAC = nodeMAC, lbMAC
	return p
}

// v4Encap and v6Encap are the Geneve an allowed LB node sends to this node.
func v4Encap(opts ...pktgen.GeneveOption) pktgen.Geneve {
	return pktgen.Geneve{Outer: pktgen.Packet{SrcMAC: lbMAC, DstMAC: nodeMAC, Src: lbV4, Dst: nodeV4}, VNI: 2, Options: opts}
}

func v6Encap(opts ...pktgen.GeneveOption) pktgen.Geneve {
	return pktgen.Geneve{Outer: pktgen.Packet{SrcMAC: lbMAC, DstMAC: nodeMAC, Src: lbV6, Dst: nodeV6}, VNI: 2, Options: opts}
}

// encapFrom is Geneve from src (an LB node or not) to this node, with any VNI and
// options.
func encapFrom(src netip.Addr, vni uint32, opts ...pktgen.GeneveOption) pktgen.Geneve {
	dst := nodeV4
	if src.Is6() {
		dst = nodeV6
	}
	return pktgen.Geneve{Outer: pktgen.Packet{SrcMAC: lbMAC, DstMAC: nodeMAC, Src: src, Dst: dst}, VNI: vni, Options: opts}
}
