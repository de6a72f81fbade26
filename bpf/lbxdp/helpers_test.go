//go:build linux

package lbxdp

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/lbd-dev/lbd/internal/testnet"
)

// Addresses of the test topology (one network namespace per test):
//
//	lbA (ingress, 198.18.0.1/24, 2001:db8::1/64) — neighbour .2 / ::2 (nhMAC)
//	    routes: backend nodes 198.18.10.0/24, 2001:db8:10::/64      → XDP_TX
//	            198.18.12.0/24, 2001:db8:12::/64 with MTU 1400 (locked: the FIB only honours locked route MTUs) → too big
//	            198.18.13.0/24 via a neighbour that does not exist   → FIB failure
//	            198.18.14.0/24 unreachable                           → FIB failure
//	lbC (198.18.1.1/24, 2001:db8:1::1/64) — neighbour .2 / ::2 (nh2MAC)
//	    routes: backend nodes 198.18.11.0/24, 2001:db8:11::/64      → XDP_REDIRECT
var (
	nhMAC     = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}
	nh2MAC    = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x03}
	clientMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x10}

	src4 = netip.MustParseAddr("198.18.0.1")
	src6 = netip.MustParseAddr("2001:db8::1")

	vip4  = netip.MustParseAddr("203.0.113.10")
	vip4b = netip.MustParseAddr("203.0.113.11")
	vip6  = netip.MustParseAddr("2001:db8:f00::10")

	client4 = netip.MustParseAddr("198.18.200.7")
	client6 = netip.MustParseAddr("2001:db8:200::7")
)

// topo is a network namespace in which the FIB lookups of test runs resolve.
type topo struct {
	ns   *testnet.NS
	devA string // lbA's name
	ifA  int
	ifC  int
	macA net.HardwareAddr
	macC net.HardwareAddr
}

func newTopo(tb testing.TB) *topo {
	tb.Helper()
	sfx := testnet.Suffix(tb)
	ns := testnet.NewNS(tb, "lbx-"+sfx)
	a, b, c, d := "lxa"+sfx, "lxb"+sfx, "lxc"+sfx, "lxd"+sfx
	testnet.Veth(tb, testnet.VethEnd{NS: ns, Name: a}, testnet.VethEnd{NS: ns, Name: b})
	testnet.Veth(tb, testnet.VethEnd{NS: ns, Name: c}, testnet.VethEnd{NS: ns, Name: d})
	ns.AddAddr(tb, a, netip.MustParsePrefix("198.18.0.1/24"), netip.MustParsePrefix("2001:db8::1/64"))
	ns.AddAddr(tb, c, netip.MustParsePrefix("198.18.1.1/24"), netip.MustParsePrefix("2001:db8:1::1/64"))
	ns.IP(tb,
		"neigh add 198.18.0.2 lladdr "+nhMAC.String()+" dev "+a+" nud permanent",
		"neigh add 2001:db8::2 lladdr "+nhMAC.String()+" dev "+a+" nud permanent",
		"neigh add 198.18.1.2 lladdr "+nh2MAC.String()+" dev "+c+" nud permanent",
		"neigh add 2001:db8:1::2 lladdr "+nh2MAC.String()+" dev "+c+" nud permanent",
		"route add 198.18.10.0/24 via 198.18.0.2 dev "+a,
		"route add 2001:db8:10::/64 via 2001:db8::2 dev "+a,
		"route add 198.18.11.0/24 via 198.18.1.2 dev "+c,
		"route add 2001:db8:11::/64 via 2001:db8:1::2 dev "+c,
		"route add 198.18.12.0/24 via 198.18.0.2 dev "+a+" mtu lock 1400",
		"route add 2001:db8:12::/64 via 2001:db8::2 dev "+a+" mtu lock 1400",
		"route add 198.18.13.0/24 via 198.18.0.3 dev "+a,
		"route add unreachable 198.18.14.0/24")
	// bpf_fib_lookup refuses to forward from a device without forwarding.
	ns.Sysctl(tb, "net.ipv4.conf.all.forwarding=1", "net.ipv6.conf.all.forwarding=1")
	la, lc := ns.Interface(tb, a), ns.Interface(tb, c)
	return &topo{ns: ns, devA: a, ifA: la.Index, macA: la.HardwareAddr, ifC: lc.Index, macC: lc.HardwareAddr}
}

// env is a loaded datapath inside a topology, with a default configuration.
type env struct {
	*topo
	d *Datapath
}

func newEnv(tb testing.TB) *env {
	tb.Helper()
	t := newTopo(tb)
	return &env{topo: t, d: loadDatapath(tb, Options{ConntrackSize: 65536, MaxBackends: 1024, MaxServices: 256})}
}

func loadDatapath(tb testing.TB, opts Options) *Datapath {
	tb.Helper()
	d, err := Load(opts)
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			tb.Fatalf("%+v", ve)
		}
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d.Close() })
	cfg := DefaultConfig()
	cfg.HashSeed = 0x5eed
	cfg.Source4 = src4
	cfg.Source6 = src6
	if err := d.SetConfig(cfg); err != nil {
		tb.Fatal(err)
	}
	return d
}

// run feeds one frame to the program as received on lbA.
func (e *env) run(tb testing.TB, frame []byte) (Verdict, []byte) {
	tb.Helper()
	return runProg(tb, e.topo, e.d.Program(), frame)
}

func runProg(tb testing.TB, t *topo, prog *ebpf.Program, frame []byte) (Verdict, []byte) {
	tb.Helper()
	var ret uint32
	out := make([]byte, len(frame)+512)
	opts := ebpf.RunOptions{
		Data:    frame,
		DataOut: out,
		Context: XDPMD{DataEnd: uint32(len(frame)), IngressIfindex: uint32(t.ifA)},
	}
	t.ns.Do(tb, func() {
		var err error
		ret, err = prog.Run(&opts)
		if err != nil {
			tb.Fatalf("run program: %v", err)
		}
	})
	return Verdict(ret), opts.DataOut
}

// pkt describes a client packet to build.
type pkt struct {
	src, dst     netip.Addr
	sport, dport uint16
	proto        uint8 // ProtoTCP (default) or ProtoUDP
	tcpFlags     uint8 // default SYN
	payload      int   // payload bytes
	vlan         uint16
	df           bool
	ipOptions    bool // IPv4: 4 bytes of options (NOP NOP NOP EOL)
	extHdr       bool // IPv6: a hop-by-hop header before the transport
	udpNoCsum    bool
	pad          int // Ethernet padding after the IP packet
}

const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpPSH = 0x08
	tcpACK = 0x10
)

func (p pkt) build(tb testing.TB) []byte {
	tb.Helper()
	if p.proto == 0 {
		p.proto = ProtoTCP
	}
	if p.tcpFlags == 0 && p.proto == ProtoTCP {
		p.tcpFlags = tcpSYN
	}
	payload := make([]byte, p.payload)
	for i := range payload {
		payload[i] = byte(i*7 + 3)
	}
	var ls []gopacket.SerializableLayer
	eth := &layers.Ethernet{SrcMAC: clientMAC, DstMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}}
	ls = append(ls, eth)
	var netLayer gopacket.NetworkLayer
	if p.src.Is4() {
		ip := &layers.IPv4{Version: 4, TTL: 60, Id: 0x1234, SrcIP: p.src.AsSlice(), DstIP: p.dst.AsSlice(), Protocol: layers.IPProtocol(p.proto), TOS: 0x28}
		if p.df {
			ip.Flags = layers.IPv4DontFragment
		}
		if p.ipOptions {
			ip.Options = []layers.IPv4Option{{OptionType: 1}, {OptionType: 1}, {OptionType: 1}, {OptionType: 0}}
		}
		netLayer = ip
		eth.EthernetType = layers.EthernetTypeIPv4
	} else {
		ip := &layers.IPv6{Version: 6, HopLimit: 60, SrcIP: p.src.AsSlice(), DstIP: p.dst.AsSlice(), NextHeader: layers.IPProtocol(p.proto), TrafficClass: 0x28, FlowLabel: 0x12345}
		netLayer = ip
		eth.EthernetType = layers.EthernetTypeIPv6
	}
	if p.vlan != 0 {
		eth.EthernetType = layers.EthernetTypeDot1Q
		ls = append(ls, &layers.Dot1Q{VLANIdentifier: p.vlan, Type: map[bool]layers.EthernetType{true: layers.EthernetTypeIPv4, false: layers.EthernetTypeIPv6}[p.src.Is4()]})
	}
	ls = append(ls, netLayer.(gopacket.SerializableLayer))
	if p.proto == ProtoTCP {
		tcp := &layers.TCP{SrcPort: layers.TCPPort(p.sport), DstPort: layers.TCPPort(p.dport), Seq: 1000, Ack: 5000, Window: 512,
			FIN: p.tcpFlags&tcpFIN != 0, SYN: p.tcpFlags&tcpSYN != 0, RST: p.tcpFlags&tcpRST != 0, PSH: p.tcpFlags&tcpPSH != 0, ACK: p.tcpFlags&tcpACK != 0}
		if err := tcp.SetNetworkLayerForChecksum(netLayer); err != nil {
			tb.Fatal(err)
		}
		ls = append(ls, tcp)
	} else {
		udp := &layers.UDP{SrcPort: layers.UDPPort(p.sport), DstPort: layers.UDPPort(p.dport)}
		if err := udp.SetNetworkLayerForChecksum(netLayer); err != nil {
			tb.Fatal(err)
		}
		ls = append(ls, udp)
	}
	ls = append(ls, gopacket.Payload(payload))
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		tb.Fatal(err)
	}
	b := buf.Bytes()
	l3 := 14
	if p.vlan != 0 {
		l3 = 18
	}
	if p.udpNoCsum {
		ihl := int(b[l3]&0x0f) * 4
		b[l3+ihl+6], b[l3+ihl+7] = 0, 0
	}
	if p.extHdr {
		// Hop-by-hop header: next header, length 0 (8 bytes), PadN of 4 bytes.
		ext := []byte{b[l3+6], 0, 1, 4, 0, 0, 0, 0}
		b[l3+6] = 0
		binary.BigEndian.PutUint16(b[l3+4:], binary.BigEndian.Uint16(b[l3+4:])+8)
		b = append(b[:l3+40], append(ext, b[l3+40:]...)...)
	}
	for range p.pad {
		b = append(b, 0xee)
	}
	return b
}

// decoded is an encapsulated packet taken apart by gopacket.
type decoded struct {
	raw      []byte
	outerEth *layers.Ethernet
	outer4   *layers.IPv4
	outer6   *layers.IPv6
	udp      *layers.UDP
	geneve   *layers.Geneve
	innerEth *layers.Ethernet
	inner4   *layers.IPv4
	inner6   *layers.IPv6
	tcp      *layers.TCP
	udpIn    *layers.UDP
	innerL3  []byte // inner IP packet bytes
}

func decodeEncap(tb testing.TB, b []byte) *decoded {
	tb.Helper()
	pk := gopacket.NewPacket(b, layers.LayerTypeEthernet, gopacket.Default)
	if el := pk.ErrorLayer(); el != nil {
		tb.Fatalf("decode: %v\n%s", el.Error(), pk.Dump())
	}
	d := &decoded{raw: b}
	var seenGeneve bool
	for _, l := range pk.Layers() {
		switch l := l.(type) {
		case *layers.Ethernet:
			if !seenGeneve {
				d.outerEth = l
			} else {
				d.innerEth = l
			}
		case *layers.IPv4:
			if !seenGeneve {
				d.outer4 = l
			} else {
				d.inner4 = l
				d.innerL3 = append(l.Contents, l.Payload...)
			}
		case *layers.IPv6:
			if !seenGeneve {
				d.outer6 = l
			} else {
				d.inner6 = l
				d.innerL3 = append(l.Contents, l.Payload...)
			}
		case *layers.UDP:
			if !seenGeneve {
				d.udp = l
			} else {
				d.udpIn = l
			}
		case *layers.Geneve:
			d.geneve = l
			seenGeneve = true
		case *layers.TCP:
			d.tcp = l
		}
	}
	if d.geneve == nil || d.innerEth == nil {
		tb.Fatalf("not a Geneve packet:\n%s", pk.Dump())
	}
	return d
}

// Independent checksum arithmetic (RFC 1071), used to verify what the program
// wrote.
func onesSum(b []byte) uint32 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	return s
}

func fold(s uint32) uint16 {
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// ipv4HeaderOK reports whether an IPv4 header's checksum verifies.
func ipv4HeaderOK(hdr []byte) bool { return fold(onesSum(hdr)) == 0xffff }

// l4SumOK verifies a TCP/UDP/ICMPv6 checksum over the pseudo-header and segment.
func l4SumOK(src, dst netip.Addr, proto uint8, seg []byte) bool {
	var ph []byte
	ph = append(ph, src.AsSlice()...)
	ph = append(ph, dst.AsSlice()...)
	if src.Is4() {
		ph = append(ph, 0, proto, byte(len(seg)>>8), byte(len(seg)))
	} else {
		ph = binary.BigEndian.AppendUint32(ph, uint32(len(seg)))
		ph = append(ph, 0, 0, 0, proto)
	}
	return fold(onesSum(ph)+onesSum(seg)) == 0xffff
}

func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

// Common service setup: one TCP and one UDP service per VIP, with backends
// on the XDP_TX node subnet.
type svcSetup struct {
	key      ServiceKey
	svc      Service
	backends []uint32
}

func (e *env) addService(tb testing.TB, s svcSetup) {
	tb.Helper()
	if err := e.d.UpsertService(s.key, s.svc); err != nil {
		tb.Fatal(err)
	}
	if len(s.backends) > 0 {
		e.setTable(tb, s.svc.ID, s.backends, 31)
	}
}

// setTable fills a table of size m round-robin over backends.
func (e *env) setTable(tb testing.TB, id uint32, backends []uint32, m int) {
	tb.Helper()
	table := make([]uint32, m)
	for i := range table {
		table[i] = backends[i%len(backends)]
	}
	if err := e.d.SetMaglevTable(id, table); err != nil {
		tb.Fatal(err)
	}
}

func (e *env) addBackend(tb testing.TB, id uint32, addr string, port uint16, node string) {
	tb.Helper()
	if err := e.d.UpsertBackend(id, Backend{Addr: netip.MustParseAddr(addr), Port: port, Node: netip.MustParseAddr(node)}); err != nil {
		tb.Fatal(err)
	}
}

func (e *env) drops(tb testing.TB) map[DropReason]Counters {
	tb.Helper()
	c, err := e.d.DropCounters()
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// expectDrop runs frame and checks it was dropped and counted under reason.
func (e *env) expectDrop(tb testing.TB, frame []byte, reason DropReason) {
	tb.Helper()
	before := e.drops(tb)[reason].Packets
	v, _ := e.run(tb, frame)
	if v != XDPDrop {
		tb.Fatalf("verdict %v, want XDP_DROP", v)
	}
	if after := e.drops(tb)[reason].Packets; after != before+1 {
		tb.Fatalf("drop counter %v: %d -> %d, want +1", reason, before, after)
	}
}

// backendOf returns which backend (by inner destination) an encapsulated
// packet went to.
func innerDst(d *decoded) netip.Addr {
	if d.inner4 != nil {
		return addrOf(d.inner4.DstIP)
	}
	return addrOf(d.inner6.DstIP)
}
