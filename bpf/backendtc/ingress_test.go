//go:build linux

package backendtc

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/lbd-dev/lbd/internal/testnet"
)

var (
	tcpSyn = flow{proto: layers.IPProtocolTCP, client: clientV4, backend: backendV4,
		flags: tcpFlags{SYN: true}}
	udpReq = flow{proto: layers.IPProtocolUDP, client: clientV4, backend: backendV4,
		payload: []byte("query")}
	tcpSyn6 = flow{proto: layers.IPProtocolTCP, client: clientV6, backend: backendV6,
		flags: tcpFlags{SYN: true}}
	udpReq6 = flow{proto: layers.IPProtocolUDP, client: clientV6, backend: backendV6,
		payload: []byte("query6")}
)

func v4Encap(opts ...[]byte) encap {
	return encap{src: lbV4, dst: nodeV4, vni: 2, opts: bytes.Join(opts, nil)}
}

func v6Encap(opts ...[]byte) encap {
	return encap{src: lbV6, dst: nodeV6, vni: 2, opts: bytes.Join(opts, nil)}
}

// with returns e with a mutation of the finished frame.
func (e encap) with(m func(f []byte)) encap {
	e.mutate = m
	return e
}

// setU16 overwrites a big-endian 16-bit field of the frame.
func setU16(off int, v uint16) func([]byte) {
	return func(f []byte) { binary.BigEndian.PutUint16(f[off:], v) }
}

type ingressCase struct {
	name  string
	flow  flow
	encap encap
	inner []byte                          // inner IP packet; flow.request() when nil
	setup func(t *testing.T, d *Datapath) // runs before the frame
	// Expectations.
	verdict uint32
	counter Counter // must read exactly 1 (other drop counters 0)
	decap   bool    // output is the inner packet behind the outer Ethernet header
	nat     *netip.AddrPort
	closing bool
}

func ptr[T any](v T) *T { return &v }

func ingressCases(tb testing.TB) []ingressCase {
	withPad := func(ip []byte) []byte { return append(append([]byte(nil), ip...), make([]byte, 6)...) }
	unknownNonCrit := geneveOpt(0x0102, 0x01, []byte{1, 2, 3, 4})
	return []ingressCase{
		{name: "v4 underlay v4 TCP SYN", flow: tcpSyn, encap: v4Encap(dsrOpt(vipV4)),
			verdict: verdictNext, counter: CounterNATCreated, decap: true, nat: &vipV4},
		{name: "v4 underlay v4 UDP", flow: udpReq, encap: v4Encap(dsrOpt(vipV4)),
			verdict: verdictNext, counter: CounterNATCreated, decap: true, nat: &vipV4},
		{name: "v6 underlay v6 TCP SYN", flow: tcpSyn6, encap: v6Encap(dsrOpt(vipV6)),
			verdict: verdictNext, counter: CounterNATCreated, decap: true, nat: &vipV6},
		{name: "v6 underlay v6 UDP", flow: udpReq6, encap: v6Encap(dsrOpt(vipV6)),
			verdict: verdictNext, counter: CounterNATCreated, decap: true, nat: &vipV6},
		{name: "v4 underlay v6 VIP", flow: tcpSyn6, encap: v4Encap(dsrOpt(vipV6)),
			verdict: verdictNext, counter: CounterNATCreated, decap: true, nat: &vipV6},
		{name: "v6 underlay v4 VIP", flow: udpReq, encap: v6Encap(dsrOpt(vipV4)),
			verdict: verdictNext, counter: CounterNATCreated, decap: true, nat: &vipV4},
		{name: "inner frame with Ethernet padding", flow: tcpSyn, encap: v4Encap(dsrOpt(vipV4)),
			inner: withPad(tcpSyn.request(tb)), verdict: verdictNext,
			counter: CounterNATCreated, decap: true, nat: &vipV4},
		{name: "unknown non-critical option skipped", flow: tcpSyn,
			encap:   v4Encap(unknownNonCrit, dsrOpt(vipV4), unknownNonCrit),
			verdict: verdictNext, counter: CounterNATCreated, decap: true, nat: &vipV4},
		{name: "port 0 in option keeps the backend port", flow: udpReq,
			encap:   v4Encap(dsrOpt(netip.AddrPortFrom(vipV4.Addr(), 0))),
			verdict: verdictNext, counter: CounterNATCreated, decap: true,
			nat: ptr(netip.AddrPortFrom(vipV4.Addr(), backendV4.Port()))},
		{name: "client FIN marks the entry closing",
			flow:    flow{proto: layers.IPProtocolTCP, client: clientV4, backend: backendV4, flags: tcpFlags{FIN: true, ACK: true}},
			encap:   v4Encap(dsrOpt(vipV4)),
			verdict: verdictNext, counter: CounterNATClosing, decap: true, nat: &vipV4, closing: true},
		{name: "inner ICMP decapsulated without NAT entry",
			flow:    flow{proto: layers.IPProtocolICMPv4, client: clientV4, backend: backendV4},
			encap:   v4Encap(dsrOpt(vipV4)),
			verdict: verdictNext, counter: CounterDecapNoNAT, decap: true},

		// Spoofing guard.
		{name: "v4 source not allowed", flow: tcpSyn,
			encap:   encap{src: strangerV4, dst: nodeV4, vni: 2, opts: dsrOpt(vipV4)},
			verdict: verdictDrop, counter: CounterDropNotAllowed},
		{name: "v6 source not allowed", flow: tcpSyn6,
			encap:   encap{src: strangerV6, dst: nodeV6, vni: 2, opts: dsrOpt(vipV6)},
			verdict: verdictDrop, counter: CounterDropNotAllowed},
		{name: "allowed prefix deleted", flow: tcpSyn, encap: v4Encap(dsrOpt(vipV4)),
			setup: func(t *testing.T, d *Datapath) {
				if err := d.DeleteAllowedSource(allowedV4); err != nil {
					t.Fatal(err)
				}
			},
			verdict: verdictDrop, counter: CounterDropNotAllowed},

		// Options.
		{name: "no options", flow: tcpSyn, encap: v4Encap(),
			verdict: verdictDrop, counter: CounterDropMissingOption},
		{name: "only a foreign non-critical option", flow: tcpSyn, encap: v4Encap(unknownNonCrit),
			verdict: verdictDrop, counter: CounterDropMissingOption},
		{name: "our class with a non-critical type", flow: tcpSyn,
			encap:   v4Encap(geneveOpt(0x014B, 0x01, dsrOpt(vipV4)[4:])),
			verdict: verdictDrop, counter: CounterDropMissingOption},
		{name: "unknown critical option", flow: tcpSyn,
			encap:   v4Encap(geneveOpt(0x0102, 0x80, []byte{1, 2, 3, 4}), dsrOpt(vipV4)),
			verdict: verdictDrop, counter: CounterDropUnknownCritical},
		{name: "DSR option of 3 words", flow: tcpSyn,
			encap:   v4Encap(geneveOpt(0x014B, 0x81, make([]byte, 12))),
			verdict: verdictDrop, counter: CounterDropMalformedOption},
		{name: "DSR option padding not zero", flow: tcpSyn,
			encap: v4Encap(dsrOpt(vipV4)).with(func(f []byte) {
				f[outerLen(lbV4)+8+4+4+2] = 0xaa
			}),
			verdict: verdictDrop, counter: CounterDropMalformedOption},
		{name: "DSR option twice", flow: tcpSyn, encap: v4Encap(dsrOpt(vipV4), dsrOpt(vip2V4)),
			verdict: verdictDrop, counter: CounterDropMalformedOption},
		{name: "option longer than the option area", flow: tcpSyn,
			encap: v4Encap(dsrOpt(vipV4)).with(func(f []byte) {
				f[outerLen(lbV4)+8+3] = 5 // 20 bytes of data, 8 present
			}),
			verdict: verdictDrop, counter: CounterDropMalformedOption},
		{name: "v4 VIP with an inner IPv6 packet", flow: tcpSyn6, encap: v4Encap(dsrOpt(vipV4)),
			verdict: verdictDrop, counter: CounterDropBadInner},

		// Geneve header.
		{name: "Geneve version 1", flow: tcpSyn,
			encap:   v4Encap(dsrOpt(vipV4)).with(func(f []byte) { f[outerLen(lbV4)] |= 0x40 }),
			verdict: verdictDrop, counter: CounterDropBadGeneve},
		{name: "Geneve OAM packet", flow: tcpSyn,
			encap:   v4Encap(dsrOpt(vipV4)).with(func(f []byte) { f[outerLen(lbV4)+1] |= 0x80 }),
			verdict: verdictDrop, counter: CounterDropBadGeneve},
		{name: "Geneve protocol not Ethernet", flow: tcpSyn,
			encap:   v4Encap(dsrOpt(vipV4)).with(setU16(outerLen(lbV4)+2, 0x0800)),
			verdict: verdictDrop, counter: CounterDropBadGeneve},
		{name: "other VNI", flow: tcpSyn,
			encap:   encap{src: lbV4, dst: nodeV4, vni: 7, opts: dsrOpt(vipV4)},
			verdict: verdictDrop, counter: CounterDropVNI},
		{name: "configured VNI accepted", flow: tcpSyn,
			encap: encap{src: lbV4, dst: nodeV4, vni: 7, opts: dsrOpt(vipV4)},
			setup: func(t *testing.T, d *Datapath) {
				if err := d.SetConfig(Config{VNI: 7}); err != nil {
					t.Fatal(err)
				}
			},
			verdict: verdictNext, counter: CounterNATCreated, decap: true, nat: &vipV4},

		// Lengths.
		{name: "outer IPv4 length beyond the frame", flow: tcpSyn,
			encap:   v4Encap(dsrOpt(vipV4)).with(setU16(14+2, 1400)),
			verdict: verdictDrop, counter: CounterDropBadLength},
		{name: "UDP length disagrees with IPv4", flow: tcpSyn,
			encap:   v4Encap(dsrOpt(vipV4)).with(setU16(14+20+4, 60)),
			verdict: verdictDrop, counter: CounterDropBadLength},
		{name: "UDP length disagrees with IPv6", flow: tcpSyn6,
			encap:   v6Encap(dsrOpt(vipV6)).with(setU16(14+40+4, 60)),
			verdict: verdictDrop, counter: CounterDropBadLength},
		{name: "option area beyond the datagram", flow: tcpSyn,
			encap: v4Encap(dsrOpt(vipV4)).with(func(f []byte) {
				f[outerLen(lbV4)] = 0x3f // 252 bytes of options
			}),
			verdict: verdictDrop, counter: CounterDropBadLength},
		{name: "inner IPv4 length beyond the datagram", flow: tcpSyn,
			encap:   v4Encap(dsrOpt(vipV4)).with(setU16(outerLen(lbV4)+8+12+14+2, 1000)),
			verdict: verdictDrop, counter: CounterDropBadLength},
		{name: "inner IPv6 payload length beyond the datagram", flow: tcpSyn6,
			encap:   v6Encap(dsrOpt(vipV6)).with(setU16(outerLen(lbV6)+8+24+14+4, 1000)),
			verdict: verdictDrop, counter: CounterDropBadLength},
		{name: "inner TCP header truncated", flow: tcpSyn, encap: v4Encap(dsrOpt(vipV4)),
			inner:   truncateIPv4(tcpSyn.request(tb), 20+12),
			verdict: verdictDrop, counter: CounterDropBadLength},

		// Not ours: untouched.
		{name: "outer first fragment passes", flow: tcpSyn,
			encap:   v4Encap(dsrOpt(vipV4)).with(setU16(14+6, 0x2000)),
			verdict: verdictNext, counter: CounterPassFragment},
	}
}

// truncateIPv4 cuts an IPv4 packet to n bytes and fixes its total length.
func truncateIPv4(ip []byte, n int) []byte {
	out := append([]byte(nil), ip[:n]...)
	binary.BigEndian.PutUint16(out[2:4], uint16(n))
	return out
}

func TestIngress(t *testing.T) {
	testnet.Require(t)
	for _, tc := range ingressCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			d := newDatapath(t)
			if tc.setup != nil {
				tc.setup(t, d)
			}
			inner := tc.inner
			if inner == nil {
				inner = tc.flow.request(t)
			}
			frame := tc.encap.frame(t, inner)
			verdict, out := run(t, d.IngressProgram(), frame)
			if verdict != tc.verdict {
				t.Errorf("verdict %#x, want %#x", verdict, tc.verdict)
			}
			checkCounters(t, d, tc.counter)

			switch {
			case tc.decap:
				checkDecap(t, frame, inner, out, tc.flow)
			case !bytes.Equal(out, frame) && tc.verdict == verdictNext:
				t.Errorf("frame modified:\n got %x\nwant %x", out, frame)
			}

			entries, err := d.NATEntries()
			if err != nil {
				t.Fatal(err)
			}
			if tc.nat == nil {
				if len(entries) != 0 {
					t.Fatalf("NAT entries %+v, want none", entries)
				}
				return
			}
			if len(entries) != 1 {
				t.Fatalf("NAT entries %+v, want one", entries)
			}
			checkEntry(t, entries[0], tc.flow, *tc.nat, tc.closing)
		})
	}
}

// checkDecap asserts the output is the outer Ethernet addresses, the inner EtherType
// and the inner IP packet byte for byte, and that gopacket reads the flow from it.
func checkDecap(t *testing.T, frame, inner, out []byte, f flow) {
	t.Helper()
	want := append(append([]byte(nil), frame[:12]...), 0, 0)
	binary.BigEndian.PutUint16(want[12:], ethType(inner))
	want = append(want, inner...)
	if !bytes.Equal(out, want) {
		t.Fatalf("decapsulated frame:\n got %x\nwant %x", out, want)
	}
	pkt := gopacket.NewPacket(out, layers.LayerTypeEthernet, gopacket.Default)
	if el := pkt.ErrorLayer(); el != nil {
		t.Fatalf("decode decapsulated frame: %v", el.Error())
	}
	nf := pkt.NetworkLayer().NetworkFlow()
	if nf.Src().String() != f.client.Addr().String() || nf.Dst().String() != f.backend.Addr().String() {
		t.Fatalf("decapsulated packet flows %v, want %v -> %v", nf, f.client.Addr(), f.backend.Addr())
	}
}

// checkCounters asserts that want reads 1 and that no other drop counter moved.
func checkCounters(t *testing.T, d *Datapath, want Counter) {
	t.Helper()
	cs, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if cs[want] != 1 {
		t.Errorf("counter %v = %d, want 1 (all: %v)", want, cs[want], cs)
	}
	for c, v := range cs {
		if c != want && c >= CounterDropNotAllowed && v != 0 {
			t.Errorf("counter %v = %d, want 0", c, v)
		}
	}
}

func checkEntry(t *testing.T, e NATEntry, f flow, vip netip.AddrPort, closing bool) {
	t.Helper()
	want := NATKey{Proto: Proto(f.proto), Backend: f.backend, Client: f.client}
	if e.NATKey != want {
		t.Errorf("NAT key %+v, want %+v", e.NATKey, want)
	}
	if e.VIP != vip {
		t.Errorf("NAT VIP %v, want %v", e.VIP, vip)
	}
	if e.Closing != closing {
		t.Errorf("NAT closing %v, want %v", e.Closing, closing)
	}
	if e.Idle < 0 || e.Idle > 5*time.Second || time.Since(e.LastSeen) > 5*time.Second {
		t.Errorf("NAT last seen %v (idle %v), want just now", e.LastSeen, e.Idle)
	}
}

func TestIngressNonGenevePassesUntouched(t *testing.T) {
	d := newDatapath(t)
	frames := map[string][]byte{
		"UDP to another port": ethFrame(lbMAC, nodeMAC, l4Packet(t, layers.IPProtocolUDP,
			netip.AddrPortFrom(lbV4, 5353), netip.AddrPortFrom(nodeV4, 53), tcpFlags{}, []byte("x"))),
		"TCP from an LB": ethFrame(lbMAC, nodeMAC, l4Packet(t, layers.IPProtocolTCP,
			netip.AddrPortFrom(lbV4, 6081), netip.AddrPortFrom(nodeV4, 6081), tcpFlags{SYN: true}, nil)),
		"IPv6 UDP to another port": ethFrame(lbMAC, nodeMAC, l4Packet(t, layers.IPProtocolUDP,
			netip.AddrPortFrom(lbV6, 5353), netip.AddrPortFrom(nodeV6, 53), tcpFlags{}, nil)),
		"ARP": serialize(t, &layers.Ethernet{SrcMAC: lbMAC, DstMAC: nodeMAC, EthernetType: layers.EthernetTypeARP},
			&layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4,
				HwAddressSize: 6, ProtAddressSize: 4, Operation: layers.ARPRequest,
				SourceHwAddress: lbMAC, SourceProtAddress: lbV4.AsSlice(),
				DstHwAddress: make([]byte, 6), DstProtAddress: nodeV4.AsSlice()}),
	}
	for name, frame := range frames {
		verdict, out := run(t, d.IngressProgram(), frame)
		if verdict != verdictNext || !bytes.Equal(out, frame) {
			t.Errorf("%s: verdict %#x, frame changed %v", name, verdict, !bytes.Equal(out, frame))
		}
	}
	cs, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	for c, v := range cs {
		if v != 0 {
			t.Errorf("counter %v = %d, want 0", c, v)
		}
	}
}

// TestIngressRefresh covers the life of an entry across packets: refresh of
// last_seen, replacement by another VIP, closing and reopening.
func TestIngressRefresh(t *testing.T) {
	d := newDatapath(t)
	send := func(f flow, vip netip.AddrPort) {
		t.Helper()
		if v, _ := run(t, d.IngressProgram(), v4Encap(dsrOpt(vip)).frame(t, f.request(t))); v != verdictNext {
			t.Fatalf("verdict %#x", v)
		}
	}
	entry := func() NATEntry {
		t.Helper()
		e, err := d.LookupNAT(NATKey{Proto: ProtoTCP, Backend: backendV4, Client: clientV4})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	send(tcpSyn, vipV4)
	// Age the entry as the GC would see it after a minute of silence.
	ageNAT(t, d, time.Minute)
	if e := entry(); e.Idle < time.Minute {
		t.Fatalf("aged entry idle %v", e.Idle)
	}
	ack := tcpSyn
	ack.flags = tcpFlags{ACK: true}
	send(ack, vipV4)
	if e := entry(); e.Idle > 5*time.Second || e.VIP != vipV4 {
		t.Errorf("after refresh: idle %v VIP %v", e.Idle, e.VIP)
	}
	send(ack, vip2V4)
	if e := entry(); e.VIP != vip2V4 {
		t.Errorf("after replacement: VIP %v, want %v", e.VIP, vip2V4)
	}
	rst := tcpSyn
	rst.flags = tcpFlags{RST: true}
	send(rst, vip2V4)
	if e := entry(); !e.Closing || !e.Expired(time.Hour, 0) || e.Expired(time.Hour, time.Minute) {
		t.Errorf("after RST: closing %v", e.Closing)
	}
	send(tcpSyn, vip2V4)
	if e := entry(); e.Closing {
		t.Error("a new SYN did not reopen the entry")
	}
	cs, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	want := map[Counter]uint64{CounterDecapOK: 5, CounterNATCreated: 1, CounterNATRefreshed: 3,
		CounterNATReplaced: 1, CounterNATClosing: 1}
	for c, v := range want {
		if cs[c] != v {
			t.Errorf("counter %v = %d, want %d", c, cs[c], v)
		}
	}
}

// ageNAT moves every entry's last_seen back by age, through the raw map.
func ageNAT(t *testing.T, d *Datapath, age time.Duration) {
	t.Helper()
	var (
		k backendtcNatKey
		v backendtcNatVal
	)
	var keys []backendtcNatKey
	var vals []backendtcNatVal
	it := d.objs.BetcNat.Iterate()
	for it.Next(&k, &v) {
		v.LastSeen -= uint64(age)
		keys = append(keys, k)
		vals = append(vals, v)
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	for i := range keys {
		if err := d.objs.BetcNat.Put(&keys[i], &vals[i]); err != nil {
			t.Fatal(err)
		}
	}
}
