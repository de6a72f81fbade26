package pktgen

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// Layers are the headers of one level of a frame as gopacket decoded them; nil when
// the level has none of that kind.
type Layers struct {
	Eth    *layers.Ethernet
	VLAN   *layers.Dot1Q
	IPv4   *layers.IPv4
	IPv6   *layers.IPv6
	TCP    *layers.TCP
	UDP    *layers.UDP
	SCTP   *layers.SCTP
	ICMPv4 *layers.ICMPv4
	ICMPv6 *layers.ICMPv6
	// IP is the IP packet, from its header to the end of its payload as its length
	// fields say (Ethernet padding excluded).
	IP []byte
}

// Src is the IP source address (invalid without an IP layer).
func (l *Layers) Src() netip.Addr {
	switch {
	case l.IPv4 != nil:
		return addr(l.IPv4.SrcIP)
	case l.IPv6 != nil:
		return addr(l.IPv6.SrcIP)
	}
	return netip.Addr{}
}

// Dst is the IP destination address (invalid without an IP layer).
func (l *Layers) Dst() netip.Addr {
	switch {
	case l.IPv4 != nil:
		return addr(l.IPv4.DstIP)
	case l.IPv6 != nil:
		return addr(l.IPv6.DstIP)
	}
	return netip.Addr{}
}

func addr(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

// Decoded is a frame as gopacket, an independent decoder, reads it: the outer layers,
// and for a Geneve frame the Geneve header and the inner frame's layers.
type Decoded struct {
	Layers
	Geneve *layers.Geneve
	Inner  Layers
	Packet gopacket.Packet
}

// Decode decodes an Ethernet frame and fails the test, with gopacket's dump, if any
// layer does not decode.
func Decode(tb testing.TB, frame []byte) *Decoded {
	tb.Helper()
	d := Parse(frame)
	if el := d.Packet.ErrorLayer(); el != nil && !appFailure(d.Packet) {
		tb.Fatalf("decode: %v\n%s", el.Error(), d.Packet.Dump())
	}
	return d
}

// appFailure reports whether only an application layer failed to decode: gopacket
// takes any payload to or from UDP port 53 for DNS, and the test payloads are not.
func appFailure(p gopacket.Packet) bool {
	ls := p.Layers()
	if len(ls) < 2 {
		return false
	}
	udp, ok := ls[len(ls)-2].(*layers.UDP)
	return ok && !failed(ls, len(ls)-2) && udp.DstPort != GenevePort
}

// failed reports whether layer i of ls failed to decode: gopacket keeps a transport
// layer that did, empty, before the failure.
func failed(ls []gopacket.Layer, i int) bool {
	return i+1 < len(ls) && ls[i+1].LayerType() == gopacket.LayerTypeDecodeFailure && len(ls[i].LayerContents()) == 0
}

// DecodeGeneve is Decode for a frame that must be Geneve with an inner frame.
func DecodeGeneve(tb testing.TB, frame []byte) *Decoded {
	tb.Helper()
	d := Decode(tb, frame)
	if d.Geneve == nil || d.Inner.Eth == nil {
		tb.Fatalf("not a Geneve frame:\n%s", d.Packet.Dump())
	}
	return d
}

// Parse decodes what it can of an Ethernet frame, a capture cut short for one: a layer
// that does not decode is in Packet.ErrorLayer, and the layers before it are set.
func Parse(frame []byte) *Decoded { return parse(frame, layers.LayerTypeEthernet) }

// ParseIP is Parse for an IP packet without Ethernet header, such as the quote of an
// ICMP error.
func ParseIP(ip []byte) *Decoded {
	if len(ip) > 0 && ip[0]>>4 == 6 {
		return parse(ip, layers.LayerTypeIPv6)
	}
	return parse(ip, layers.LayerTypeIPv4)
}

func parse(b []byte, first gopacket.Decoder) *Decoded {
	d := &Decoded{Packet: gopacket.NewPacket(b, first, gopacket.Default)}
	l := &d.Layers
	ls := d.Packet.Layers()
	for i, layer := range ls {
		if failed(ls, i) {
			break
		}
		switch layer := layer.(type) {
		case *layers.Ethernet:
			l.Eth = layer
		case *layers.Dot1Q:
			l.VLAN = layer
		case *layers.IPv4:
			l.IPv4, l.IP = layer, ipBytes(layer.Contents, int(layer.Length))
		case *layers.IPv6:
			l.IPv6, l.IP = layer, ipBytes(layer.Contents, 40+int(layer.Length))
		case *layers.TCP:
			l.TCP = layer
		case *layers.UDP:
			l.UDP = layer
		case *layers.SCTP:
			l.SCTP = layer
		case *layers.ICMPv4:
			l.ICMPv4 = layer
		case *layers.ICMPv6:
			l.ICMPv6 = layer
		case *layers.Geneve:
			d.Geneve, l = layer, &d.Inner
		}
	}
	return d
}

// ipBytes extends an IP header to the n bytes of its packet: gopacket's layers are
// slices of one buffer, and an IPv6 layer's Contents leave the hop-by-hop header out
// of both itself and its Payload.
func ipBytes(hdr []byte, n int) []byte {
	return slices.Clone(hdr[:min(n, cap(hdr))])
}

// Diff describes how got differs from want: field by field for each layer that
// gopacket decodes from both, then the first byte that differs. It is "" when the
// frames are equal.
func Diff(want, got []byte) string {
	if bytes.Equal(want, got) {
		return ""
	}
	var b strings.Builder
	wl, gl := Parse(want).Packet.Layers(), Parse(got).Packet.Layers()
	for i := range max(len(wl), len(gl)) {
		switch {
		case i >= len(wl):
			fmt.Fprintf(&b, "extra layer %v\n", gl[i].LayerType())
		case i >= len(gl):
			fmt.Fprintf(&b, "missing layer %v\n", wl[i].LayerType())
		case wl[i].LayerType() != gl[i].LayerType():
			fmt.Fprintf(&b, "layer %d: got %v, want %v\n", i, gl[i].LayerType(), wl[i].LayerType())
		default:
			diffFields(&b, wl[i], gl[i])
		}
	}
	n := 0
	for n < min(len(want), len(got)) && want[n] == got[n] {
		n++
	}
	fmt.Fprintf(&b, "%d bytes, want %d; first difference at byte %d", len(got), len(want), n)
	if n < min(len(want), len(got)) {
		fmt.Fprintf(&b, ": got %#02x, want %#02x", got[n], want[n])
	}
	return b.String()
}

// diffFields writes the exported fields in which two layers of one type differ.
func diffFields(b *strings.Builder, want, got gopacket.Layer) {
	wv, gv := reflect.Indirect(reflect.ValueOf(want)), reflect.Indirect(reflect.ValueOf(got))
	if wv.Kind() != reflect.Struct {
		if !bytes.Equal(want.LayerContents(), got.LayerContents()) {
			fmt.Fprintf(b, "%v: got % x, want % x\n", want.LayerType(), got.LayerContents(), want.LayerContents())
		}
		return
	}
	for i := range wv.NumField() {
		f := wv.Type().Field(i)
		if !f.IsExported() || f.Anonymous {
			continue
		}
		if w, g := wv.Field(i).Interface(), gv.Field(i).Interface(); !reflect.DeepEqual(w, g) {
			fmt.Fprintf(b, "%v.%s: got %v, want %v\n", want.LayerType(), f.Name, g, w)
		}
	}
}

// ExpectFrame fails the test with Diff's description unless got is want, and
// reports whether it is.
func ExpectFrame(tb testing.TB, got, want []byte) bool {
	tb.Helper()
	if d := Diff(want, got); d != "" {
		tb.Errorf("frame differs:\n%s", d)
		return false
	}
	return true
}
