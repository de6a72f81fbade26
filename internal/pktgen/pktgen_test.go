package pktgen

import (
	"bytes"
	"encoding/binary"
	"maps"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

var (
	c4 = netip.MustParseAddr("198.18.200.7")
	v4 = netip.MustParseAddr("203.0.113.10")
	c6 = netip.MustParseAddr("2001:db8:200::7")
	v6 = netip.MustParseAddr("2001:db8:f00::10")
)

// packets covers every knob that keeps a packet correct, in both families.
func packets() map[string]Packet {
	ps := map[string]Packet{
		"tcp4 syn":             {Src: c4, Dst: v4, SrcPort: 40000, DstPort: 80},
		"tcp4 df odd payload":  {Src: c4, Dst: v4, SrcPort: 1, DstPort: 2, DF: true, Flags: ACK | PSH, Payload: Bytes(101)},
		"tcp4 ip options vlan": {Src: c4, Dst: v4, SrcPort: 1, DstPort: 2, IPOptions: []byte{1, 1, 1}, VLAN: 42, Pad: 6},
		"udp4":                 {Src: c4, Dst: v4, SrcPort: 5353, DstPort: 53, Proto: ProtoUDP, Payload: []byte("odd")},
		"udp4 without sum":     {Src: c4, Dst: v4, SrcPort: 5353, DstPort: 53, Proto: ProtoUDP, NoUDPChecksum: true},
		"icmp4 error":          {Src: c4, Dst: v4, Proto: ProtoICMPv4, ICMPType: 3, ICMPCode: 4, ICMPRest: 1400, Payload: Bytes(28)},
		"tcp4 first fragment":  {Src: c4, Dst: v4, SrcPort: 1, DstPort: 2, Fragment: &Fragment{More: true}},
		"tcp6 fin":             {Src: c6, Dst: v6, SrcPort: 40000, DstPort: 80, Flags: FIN | ACK, Payload: Bytes(7)},
		"tcp6 hop-by-hop vlan": {Src: c6, Dst: v6, SrcPort: 1, DstPort: 2, HopByHop: true, VLAN: 7},
		"udp6":                 {Src: c6, Dst: v6, SrcPort: 1, DstPort: 53, Proto: ProtoUDP, Payload: Bytes(9)},
		"icmp6 error":          {Src: c6, Dst: v6, Proto: ProtoICMPv6, ICMPType: 2, ICMPRest: 1280, Payload: Bytes(48)},
		"tcp6 atomic fragment": {Src: c6, Dst: v6, SrcPort: 1, DstPort: 2, HopByHop: true, Fragment: &Fragment{}},
		"sctp4 init":           {Src: c4, Dst: v4, SrcPort: 36412, DstPort: 36412, Proto: ProtoSCTP, Chunks: []SCTPChunk{{Type: SCTPInit, Value: Bytes(16)}}},
		"sctp6 data odd":       {Src: c6, Dst: v6, SrcPort: 3868, DstPort: 3868, Proto: ProtoSCTP, VTag: 0xdeadbeef, Chunks: []SCTPChunk{{Type: SCTPData, Flags: 3, Value: Bytes(17)}}},
	}
	all := map[string]Packet{}
	for name, p := range ps {
		p.TTL, p.TOS, p.ID, p.FlowLabel, p.Seq, p.Ack, p.Window = 1, 0xb8, 7, 9, 11, 12, 13
		if p.withDefaults().Proto == ProtoTCP {
			p.Flags = RST
		}
		all[name+", every default replaced"] = p
	}
	maps.Copy(ps, all)
	return ps
}

// TestRoundTrip: gopacket decodes every field as the builder was told.
func TestRoundTrip(t *testing.T) {
	for name, p := range packets() {
		t.Run(name, func(t *testing.T) {
			frame := p.Frame()
			d := Decode(t, frame)
			q := p.withDefaults()
			if !bytes.Equal(d.Eth.SrcMAC, q.SrcMAC) || !bytes.Equal(d.Eth.DstMAC, q.DstMAC) {
				t.Errorf("MACs %v -> %v", d.Eth.SrcMAC, d.Eth.DstMAC)
			}
			if (d.VLAN != nil) != (p.VLAN != 0) || d.VLAN != nil && d.VLAN.VLANIdentifier != p.VLAN {
				t.Errorf("VLAN %+v, want %d", d.VLAN, p.VLAN)
			}
			if d.Src() != p.Src || d.Dst() != p.Dst {
				t.Errorf("addresses %v -> %v", d.Src(), d.Dst())
			}
			if len(frame) != 14+4*min(int(p.VLAN), 1)+len(d.IP)+p.Pad {
				t.Errorf("frame of %d bytes: IP packet of %d, padding %d", len(frame), len(d.IP), p.Pad)
			}
			if ip := d.IPv4; ip != nil {
				df := ip.Flags&layers.IPv4DontFragment != 0
				more := ip.Flags&layers.IPv4MoreFragments != 0
				if ip.TTL != q.TTL || ip.TOS != q.TOS || ip.Id != q.ID || df != p.DF || more != (p.Fragment != nil && p.Fragment.More) ||
					uint8(ip.Protocol) != q.Proto || int(ip.IHL)*4 != 20+(len(p.IPOptions)+3)/4*4 {
					t.Errorf("IPv4 header %+v", ip)
				}
			}
			if ip := d.IPv6; ip != nil {
				if ip.HopLimit != q.TTL || ip.TrafficClass != q.TOS || ip.FlowLabel != q.FlowLabel || (ip.HopByHop != nil) != p.HopByHop {
					t.Errorf("IPv6 header %+v", ip)
				}
				if f, ok := d.Packet.Layer(layers.LayerTypeIPv6Fragment).(*layers.IPv6Fragment); (p.Fragment != nil) != ok ||
					ok && (f.FragmentOffset != p.Fragment.Offset || f.MoreFragments != p.Fragment.More || f.Identification != uint32(q.ID)) {
					t.Errorf("IPv6 fragment header %+v, want %+v", f, p.Fragment)
				}
			}
			if p.Fragment != nil {
				// gopacket leaves a fragment's payload undecoded, even an atomic one.
				if f := d.Packet.Layer(gopacket.LayerTypeFragment); f == nil || !bytes.Equal(f.LayerContents(), frame[Locate(frame).L4:len(frame)-p.Pad]) {
					t.Errorf("fragment payload %v", f)
				}
				return
			}
			checkTransport(t, d, q)
		})
	}
}

func checkTransport(t *testing.T, d *Decoded, p Packet) {
	t.Helper()
	var payload []byte
	switch p.Proto {
	case ProtoTCP:
		tcp := d.TCP
		if tcp == nil {
			t.Fatalf("no TCP layer:\n%s", d.Packet.Dump())
		}
		flags := TCPFlags(0)
		for f, on := range map[TCPFlags]bool{FIN: tcp.FIN, SYN: tcp.SYN, RST: tcp.RST, PSH: tcp.PSH, ACK: tcp.ACK} {
			if on {
				flags |= f
			}
		}
		if uint16(tcp.SrcPort) != p.SrcPort || uint16(tcp.DstPort) != p.DstPort || flags != p.Flags || tcp.Seq != p.Seq ||
			tcp.Ack != p.Ack || tcp.Window != p.Window || tcp.DataOffset != 5 {
			t.Errorf("TCP header %+v", tcp)
		}
		payload = tcp.Payload
	case ProtoUDP:
		if d.UDP == nil || uint16(d.UDP.SrcPort) != p.SrcPort || uint16(d.UDP.DstPort) != p.DstPort || int(d.UDP.Length) != 8+len(p.Payload) {
			t.Fatalf("UDP header %+v", d.UDP)
		}
		payload = d.UDP.Payload
	case ProtoICMPv4:
		icmp := d.ICMPv4
		if icmp == nil || icmp.TypeCode != layers.CreateICMPv4TypeCode(p.ICMPType, p.ICMPCode) || uint32(icmp.Id)<<16|uint32(icmp.Seq) != p.ICMPRest {
			t.Fatalf("ICMP header %+v", icmp)
		}
		payload = icmp.Payload
	case ProtoICMPv6:
		icmp := d.ICMPv6
		if icmp == nil || icmp.TypeCode != layers.CreateICMPv6TypeCode(p.ICMPType, p.ICMPCode) || binary.BigEndian.Uint32(icmp.Payload) != p.ICMPRest {
			t.Fatalf("ICMPv6 header %+v", icmp)
		}
		payload = icmp.Payload[4:]
	case ProtoSCTP:
		s := d.SCTP
		if s == nil || uint16(s.SrcPort) != p.SrcPort || uint16(s.DstPort) != p.DstPort || s.VerificationTag != p.VTag {
			t.Fatalf("SCTP header %+v", s)
		}
		// gopacket computes the CRC32c on its own when it serializes the header.
		buf := gopacket.NewSerializeBuffer()
		chunks, err := buf.AppendBytes(len(s.Payload))
		if err != nil {
			t.Fatal(err)
		}
		copy(chunks, s.Payload)
		if err := (layers.SCTP{SrcPort: s.SrcPort, DstPort: s.DstPort, VerificationTag: s.VerificationTag}).SerializeTo(buf,
			gopacket.SerializeOptions{ComputeChecksums: true}); err != nil {
			t.Fatal(err)
		}
		if want := binary.BigEndian.Uint32(buf.Bytes()[8:]); s.Checksum != want {
			t.Errorf("SCTP checksum %#08x, gopacket computes %#08x", s.Checksum, want)
		}
		return
	}
	if !bytes.Equal(payload, p.Payload) {
		t.Errorf("payload % x, want % x", payload, p.Payload)
	}
}

// gopacketMismatches has gopacket verify every checksum of a frame it decoded.
func gopacketMismatches(t *testing.T, d *Decoded) []gopacket.ChecksumMismatch {
	t.Helper()
	var nl gopacket.NetworkLayer
	for _, l := range d.Packet.Layers() {
		if n, ok := l.(gopacket.NetworkLayer); ok {
			nl = n
		}
		if c, ok := l.(interface {
			SetNetworkLayerForChecksum(gopacket.NetworkLayer) error
		}); ok {
			if err := c.SetNetworkLayerForChecksum(nl); err != nil {
				t.Fatal(err)
			}
		}
	}
	err, bad := d.Packet.VerifyChecksums()
	if err != nil {
		t.Fatal(err)
	}
	return bad
}

// TestChecksums: what the builder writes, gopacket and VerifyIP find correct; what
// the knobs break, both find wrong.
func TestChecksums(t *testing.T) {
	for name, p := range packets() {
		t.Run(name, func(t *testing.T) {
			d := Decode(t, p.Frame())
			if bad := gopacketMismatches(t, d); len(bad) != 0 {
				t.Errorf("gopacket finds wrong checksums: %+v", bad)
			}
			if err := VerifyIP(d.IP); err != nil {
				t.Errorf("VerifyIP: %v", err)
			}
			for knob, q := range map[string]Packet{"BadL4Checksum": {BadL4Checksum: true}, "BadIPChecksum": {BadIPChecksum: true}} {
				if q.BadIPChecksum && p.Src.Is6() || p.Fragment != nil && q.BadL4Checksum {
					continue // nothing to break; a fragment's transport is not checked
				}
				q.Src, q.Dst, q.Proto, q.SrcPort, q.DstPort, q.Payload = p.Src, p.Dst, p.Proto, p.SrcPort, p.DstPort, p.Payload
				q.Chunks = p.Chunks
				bd := Decode(t, q.Frame())
				// gopacket does not verify SCTP's CRC32c (checkTransport compares it with
				// the one gopacket computes).
				want := 1
				if p.Proto == ProtoSCTP && q.BadL4Checksum {
					want = 0
				}
				if bad := gopacketMismatches(t, bd); len(bad) != want {
					t.Errorf("%s: gopacket finds %d wrong checksums, want %d", knob, len(bad), want)
				}
				if err := VerifyIP(bd.IP); err == nil {
					t.Errorf("%s: VerifyIP finds no wrong checksum", knob)
				}
			}
		})
	}
	// A UDP checksum of 0 means none over IPv4; IPv6 requires one.
	for src, want := range map[netip.Addr]bool{c4: true, c6: false} {
		dst := map[bool]netip.Addr{true: v4, false: v6}[src.Is4()]
		ip := Packet{Src: src, Dst: dst, Proto: ProtoUDP, NoUDPChecksum: true}.IP()
		if err := VerifyIP(ip); (err == nil) != want {
			t.Errorf("UDP without checksum from %v: %v", src, err)
		}
	}
}

// TestChecksumZero: a UDP checksum that computes to 0 is sent as 0xffff (0 would
// mean none), and VerifyIP accepts it.
func TestChecksumZero(t *testing.T) {
	p := Packet{Src: c4, Dst: v4, Proto: ProtoUDP, SrcPort: 1, DstPort: 2, Payload: []byte{0, 0}}
	ip := p.IP()
	// Choose the payload that makes the sum come out at 0: the checksum's value.
	binary.BigEndian.PutUint16(p.Payload, binary.BigEndian.Uint16(ip[26:]))
	ip = p.IP()
	if got := binary.BigEndian.Uint16(ip[26:]); got != 0xffff {
		t.Fatalf("checksum %#04x, want 0xffff", got)
	}
	if err := VerifyIP(ip); err != nil {
		t.Error(err)
	}
}

// TestVerifyPartial: a segment whose checksum field holds the pseudo-header sum
// passes; a complete checksum does not.
func TestVerifyPartial(t *testing.T) {
	for _, p := range []Packet{{Src: c4, Dst: v4, SrcPort: 1, DstPort: 2}, {Src: c6, Dst: v6, Proto: ProtoUDP, Payload: Bytes(3)}} {
		ip := p.IP()
		if err := VerifyPartial(ip); err == nil {
			t.Errorf("%v: a complete checksum passes as partial", p.Src)
		}
		at := Locate(p.Wrap(ip))
		off := map[uint8]int{ProtoTCP: 16, ProtoUDP: 6}[p.withDefaults().Proto]
		l4 := ip[at.L4-at.L3:]
		binary.BigEndian.PutUint16(l4[off:], sum(pseudoHeader(p.Src, p.Dst, p.withDefaults().Proto, len(l4))))
		if err := VerifyPartial(ip); err != nil {
			t.Errorf("%v: %v", p.Src, err)
		}
	}
}

// TestGeneve: gopacket reads the encapsulation as docs/wire-format.md describes it, and the
// knobs break what they say.
func TestGeneve(t *testing.T) {
	inner := Packet{Src: c4, Dst: netip.MustParseAddr("198.18.20.1"), SrcPort: 40000, DstPort: 8080}.IP()
	for _, vip := range []netip.AddrPort{netip.AddrPortFrom(v4, 80), netip.AddrPortFrom(v6, 443)} {
		for _, outer := range []Packet{{Src: netip.MustParseAddr("198.18.0.1"), Dst: netip.MustParseAddr("198.18.1.2")}, {Src: c6, Dst: v6}} {
			g := Geneve{Outer: outer, VNI: 2, Options: []GeneveOption{DSROption(vip)}}
			d := DecodeGeneve(t, g.Frame(inner))
			if d.UDP.DstPort != GenevePort || d.UDP.SrcPort != geneveSrcPort || d.Src() != outer.Src || d.Dst() != outer.Dst {
				t.Errorf("outer %v -> %v, UDP %+v", d.Src(), d.Dst(), d.UDP)
			}
			if bad := gopacketMismatches(t, d); len(bad) != 0 {
				t.Errorf("gopacket finds wrong checksums: %+v", bad)
			}
			gn := d.Geneve
			if gn.Version != 0 || gn.VNI != 2 || gn.Protocol != layers.EthernetTypeTransparentEthernetBridging || gn.OAMPacket || !gn.CriticalOption || len(gn.Options) != 1 {
				t.Fatalf("Geneve header %+v", gn)
			}
			o, words := gn.Options[0], 2
			if vip.Addr().Is6() {
				words = 5
			}
			want := append(vip.Addr().AsSlice(), byte(vip.Port()>>8), byte(vip.Port()), 0, 0)
			if o.Class != 0x014B || o.Type != 0x81 || o.Flags != 0 || int(o.Length) != 4+4*words || !bytes.Equal(o.Data, want) {
				t.Errorf("DSR option %+v, want data % x", o, want)
			}
			if !bytes.Equal(d.Inner.IP, inner) || d.Inner.TCP == nil {
				t.Errorf("inner packet % x, want % x", d.Inner.IP, inner)
			}
		}
	}

	base := Geneve{Outer: Packet{Src: c4, Dst: v4}, VNI: 7, Options: []GeneveOption{{Class: 0x0102, Type: 1, Data: Bytes(4)}}}
	knobs := map[string]struct {
		g    func(g Geneve) Geneve
		want func(h []byte) bool
	}{
		"none":     {func(g Geneve) Geneve { return g }, func(h []byte) bool { return bytes.Equal(h[:8], []byte{2, 0, 0x65, 0x58, 0, 0, 7, 0}) }},
		"Version":  {func(g Geneve) Geneve { g.Version = 1; return g }, func(h []byte) bool { return h[0] == 0x42 }},
		"OAM":      {func(g Geneve) Geneve { g.OAM = true; return g }, func(h []byte) bool { return h[1] == 0x80 }},
		"Protocol": {func(g Geneve) Geneve { g.Protocol = 0x0800; return g }, func(h []byte) bool { return h[2] == 8 && h[3] == 0 }},
		"OptLen":   {func(g Geneve) Geneve { g.OptLen = 0x3f; return g }, func(h []byte) bool { return h[0] == 0x3f }},
		"option Len": {func(g Geneve) Geneve {
			g.Options = []GeneveOption{{Class: 1, Type: 2, Data: Bytes(8), Len: 5}}
			return g
		},
			func(h []byte) bool { return h[0] == 3 && bytes.Equal(h[8:12], []byte{0, 1, 2, 5}) }},
	}
	for name, k := range knobs {
		if h := k.g(base).Header(); !k.want(h) {
			t.Errorf("%s: header % x", name, h)
		}
	}
}

// TestLocate: the offsets are where gopacket finds each layer.
func TestLocate(t *testing.T) {
	for name, p := range packets() {
		frame := p.Frame()
		d := Decode(t, frame)
		at := Locate(frame)
		want := len(d.Eth.Contents)
		if d.VLAN != nil {
			want += len(d.VLAN.Contents)
		}
		if at.L3 != want {
			t.Errorf("%s: L3 at %d, want %d", name, at.L3, want)
		}
		if tl := d.Packet.TransportLayer(); tl != nil && at.L4 != len(frame)-len(tl.LayerContents())-len(tl.LayerPayload())-p.Pad {
			t.Errorf("%s: L4 at %d", name, at.L4)
		}
		if at.Geneve != 0 || at.InnerL3 != 0 {
			t.Errorf("%s: Geneve offsets in a plain frame: %+v", name, at)
		}
	}
	inner := Packet{Src: c6, Dst: v6, HopByHop: true, Proto: ProtoUDP}
	frame := Geneve{Outer: Packet{Src: c4, Dst: v4, VLAN: 3}, Options: []GeneveOption{DSROption(netip.AddrPortFrom(v6, 1))}}.Frame(inner.IP())
	if at, want := Locate(frame), (Offsets{L3: 18, L4: 38, Geneve: 46, InnerL3: 46 + 8 + 24 + 14, InnerL4: 46 + 8 + 24 + 14 + 48}); at != want {
		t.Errorf("Geneve frame: %+v, want %+v", at, want)
	}
	e := Edit(frame, func(b []byte, at Offsets) { b[at.InnerL4] = 0xee })
	if e[Locate(frame).InnerL4] != 0xee || bytes.Equal(e, frame) || frame[Locate(frame).InnerL4] == 0xee {
		t.Error("Edit did not change a copy")
	}
}

// TestDiff names the fields that differ.
func TestDiff(t *testing.T) {
	p := Packet{Src: c4, Dst: v4, SrcPort: 1, DstPort: 2}
	if d := Diff(p.Frame(), p.Frame()); d != "" {
		t.Errorf("equal frames: %q", d)
	}
	q := p
	q.TTL, q.DstPort = 3, 4
	d := Diff(p.Frame(), q.Frame())
	for _, want := range []string{"IPv4.TTL: got 3, want 60", "TCP.DstPort: got 4", "first difference at byte 22"} {
		if !strings.Contains(d, want) {
			t.Errorf("diff %q lacks %q", d, want)
		}
	}
	if d := Diff(p.Frame(), p.Frame()[:30]); !strings.Contains(d, "30 bytes, want 54") {
		t.Errorf("cut frame: %q", d)
	}
	rec := &recorder{TB: t}
	if ExpectFrame(rec, q.Frame(), p.Frame()) || !rec.failed {
		t.Error("ExpectFrame passed different frames")
	}
}

// recorder is a test that records a failure instead of failing.
type recorder struct {
	testing.TB
	failed bool
}

func (r *recorder) Errorf(string, ...any) { r.failed = true }

// Fatalf ends the goroutine, as testing's does: call it through fails.
func (r *recorder) Fatalf(string, ...any) { r.failed = true; runtime.Goexit() }

func (r *recorder) Helper() {}

// fails reports whether fn fails the test it is given.
func fails(t *testing.T, fn func(tb testing.TB)) bool {
	rec := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(rec)
	}()
	<-done
	return rec.failed
}

func TestARPRequest(t *testing.T) {
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 9}
	d := Decode(t, ARPRequest(mac, c4, v4))
	arp, ok := d.Packet.Layer(layers.LayerTypeARP).(*layers.ARP)
	if !ok || arp.Operation != layers.ARPRequest || !bytes.Equal(arp.SourceHwAddress, mac) ||
		!bytes.Equal(arp.SourceProtAddress, c4.AsSlice()) || !bytes.Equal(arp.DstProtAddress, v4.AsSlice()) ||
		!bytes.Equal(d.Eth.DstMAC, layers.EthernetBroadcast) {
		t.Errorf("ARP %+v", arp)
	}
}

// TestRun puts a trivial XDP program (it returns XDP_TX) through the runner: the
// hooks run in order, the context and the wrapper are used, the frame comes back.
func TestRun(t *testing.T) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.XDP,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 3), asm.Return()},
		License:      "Dual BSD/GPL",
	})
	if err != nil {
		t.Skipf("needs root: load an XDP program: %v", err)
	}
	defer prog.Close()
	type xdpMD struct{ Data, DataEnd, DataMeta, Ingress, RxQueue, Egress uint32 }
	var steps []string
	env := func(t *testing.T) (*[]string, Prog) {
		return &steps, Prog{
			Program: prog,
			Context: func(f []byte) any { steps = append(steps, "context"); return xdpMD{DataEnd: uint32(len(f))} },
			Within:  func(run func()) error { steps = append(steps, "within"); run(); return nil },
		}
	}
	frame := Packet{Src: c4, Dst: v4, SrcPort: 1, DstPort: 2}.Frame()
	Run(t, env, []Case[*[]string, uint32]{{
		Name:    "tx",
		In:      frame,
		Setup:   func(t *testing.T, s *[]string) { *s = append(*s, "setup") },
		Verdict: 3,
		Check: func(t *testing.T, s *[]string, in, out []byte) {
			*s = append(*s, "check")
			ExpectFrame(t, out, in)
		},
	}})
	if got := strings.Join(steps, " "); got != "setup context within check" {
		t.Errorf("steps %q", got)
	}
}

// TestParse: a frame cut short, as a capture keeps it, gives the layers before the
// cut; a quote of an IP packet decodes as IP.
func TestParse(t *testing.T) {
	p := Packet{Src: c6, Dst: v6, SrcPort: 1, DstPort: 2, Payload: Bytes(100)}
	d := Parse(p.Frame()[:14+40+10])
	if d.Packet.ErrorLayer() == nil || d.IPv6 == nil || d.Dst() != v6 || d.TCP != nil {
		t.Errorf("cut frame: %v", d.Packet)
	}
	q := ParseIP(Packet{Src: c4, Dst: v4, SrcPort: 1, DstPort: 2}.IP()[:28])
	if q.IPv4 == nil || q.Src() != c4 || q.Dst() != v4 {
		t.Errorf("quote: %v", q.Packet)
	}
	// Decode fails on a cut transport header, not on a payload that gopacket takes
	// for DNS.
	if !fails(t, func(tb testing.TB) { Decode(tb, p.Frame()[:14+40+10]) }) {
		t.Error("Decode passed a cut TCP header")
	}
	dns := Packet{Src: c4, Dst: v4, SrcPort: 1, DstPort: 53, Proto: ProtoUDP, Payload: Bytes(3)}
	if fails(t, func(tb testing.TB) { Decode(tb, dns.Frame()) }) {
		t.Error("Decode failed a UDP payload to port 53")
	}
}
