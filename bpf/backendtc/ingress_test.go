//go:build linux

package backendtc

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/pktgen"
)

var (
	tcpSyn  = flow{proto: pktgen.ProtoTCP, client: clientV4, backend: backendV4, flags: pktgen.SYN}
	udpReq  = flow{proto: pktgen.ProtoUDP, client: clientV4, backend: backendV4, payload: []byte("query")}
	tcpSyn6 = flow{proto: pktgen.ProtoTCP, client: clientV6, backend: backendV6, flags: pktgen.SYN}
	udpReq6 = flow{proto: pktgen.ProtoUDP, client: clientV6, backend: backendV6, payload: []byte("query6")}
	// SCTP keeps its port from VIP to backend (lbd does not rewrite SCTP ports).
	sctpInit  = flow{proto: pktgen.ProtoSCTP, client: clientV4, backend: backendV4, chunk: pktgen.SCTPInit, payload: pktgen.Bytes(16)}
	sctpInit6 = flow{proto: pktgen.ProtoSCTP, client: clientV6, backend: backendV6, chunk: pktgen.SCTPInit, payload: pktgen.Bytes(16)}
	sctpVIP4  = netip.AddrPortFrom(vipV4.Addr(), backendV4.Port())
	sctpVIP6  = netip.AddrPortFrom(vipV6.Addr(), backendV6.Port())
)

// ovn is OVN's metadata option: critical, of a class lbd does not know.
var ovn = pktgen.GeneveOption{Class: 0x0102, Type: 0x80, Data: []byte{0, 0, 0, 5}}

// ingressCase is a frame in, the state it meets, the verdict and what the frame must
// leave behind: the frame out, the counter it moves, the NAT entries.
type ingressCase = pktgen.Case[*Datapath, uint32]

// ingressCases are the ingress tests; the fuzz test starts from their frames too.
func ingressCases() []ingressCase {
	// A well-formed frame with other options or headers.
	frame := func(g pktgen.Geneve, f flow) []byte { return g.Frame(f.request()) }
	dsr4, dsr6 := pktgen.DSROption(vipV4), pktgen.DSROption(vipV6)
	lb4 := v4Encap().Outer
	unknownNonCrit := pktgen.GeneveOption{Class: 0x0102, Type: 0x01, Data: []byte{1, 2, 3, 4}}
	badPad := pktgen.DSROption(vipV4)
	badPad.Data[6] = 0xaa
	tooLong := pktgen.DSROption(vipV4)
	tooLong.Len = 5 // 20 bytes of data, 8 present
	overrun := pktgen.GeneveOption{Class: 0x0102, Type: 0x01, Data: []byte{1, 2, 3, 4}, Len: 9}
	empties := func(n int) []pktgen.GeneveOption {
		return slices.Repeat([]pktgen.GeneveOption{{Class: 0x0102, Type: 0x02}}, n)
	}
	put16 := func(at func(pktgen.Offsets) int, v uint16) func([]byte, pktgen.Offsets) {
		return func(b []byte, o pktgen.Offsets) { binary.BigEndian.PutUint16(b[at(o):], v) }
	}
	allowedDeleted := func(t *testing.T, d *Datapath) {
		if err := d.DeleteAllowedSource(allowedV4); err != nil {
			t.Fatal(err)
		}
	}
	vni7 := func(t *testing.T, d *Datapath) {
		if err := d.SetConfig(Config{VNI: 7}); err != nil {
			t.Fatal(err)
		}
	}
	finAck := tcpSyn
	finAck.flags = pktgen.FIN | pktgen.ACK
	echo := flow{proto: pktgen.ProtoICMPv4, client: clientV4, backend: backendV4}
	sctpAbort := sctpInit
	sctpAbort.chunk, sctpAbort.payload = pktgen.SCTPAbort, nil
	port0 := netip.AddrPortFrom(vipV4.Addr(), 0)
	return append([]ingressCase{
		{Name: "v4 underlay v4 TCP SYN", In: frame(v4Encap(dsr4), tcpSyn),
			Verdict: verdictNext, Check: natted(tcpSyn, vipV4, CounterNATCreated, false)},
		{Name: "v4 underlay v4 UDP", In: frame(v4Encap(dsr4), udpReq),
			Verdict: verdictNext, Check: natted(udpReq, vipV4, CounterNATCreated, false)},
		{Name: "v6 underlay v6 TCP SYN", In: frame(v6Encap(dsr6), tcpSyn6),
			Verdict: verdictNext, Check: natted(tcpSyn6, vipV6, CounterNATCreated, false)},
		{Name: "v6 underlay v6 UDP", In: frame(v6Encap(dsr6), udpReq6),
			Verdict: verdictNext, Check: natted(udpReq6, vipV6, CounterNATCreated, false)},
		{Name: "v4 underlay v6 VIP", In: frame(v4Encap(dsr6), tcpSyn6),
			Verdict: verdictNext, Check: natted(tcpSyn6, vipV6, CounterNATCreated, false)},
		{Name: "v6 underlay v4 VIP", In: frame(v6Encap(dsr4), udpReq),
			Verdict: verdictNext, Check: natted(udpReq, vipV4, CounterNATCreated, false)},
		{Name: "inner frame with Ethernet padding", In: v4Encap(dsr4).Frame(append(tcpSyn.request(), make([]byte, 6)...)),
			Verdict: verdictNext, Check: natted(tcpSyn, vipV4, CounterNATCreated, false)},
		{Name: "unknown non-critical option skipped", In: frame(v4Encap(unknownNonCrit, dsr4, unknownNonCrit), tcpSyn),
			Verdict: verdictNext, Check: natted(tcpSyn, vipV4, CounterNATCreated, false)},
		{Name: "port 0 in option keeps the backend port", In: frame(v4Encap(pktgen.DSROption(port0)), udpReq),
			Verdict: verdictNext, Check: natted(udpReq, netip.AddrPortFrom(vipV4.Addr(), backendV4.Port()), CounterNATCreated, false)},
		{Name: "client FIN marks the entry closing", In: frame(v4Encap(dsr4), finAck),
			Verdict: verdictNext, Check: natted(finAck, vipV4, CounterNATClosing, true)},
		{Name: "v4 underlay v4 SCTP INIT", In: frame(v4Encap(pktgen.DSROption(sctpVIP4)), sctpInit),
			Verdict: verdictNext, Check: natted(sctpInit, sctpVIP4, CounterNATCreated, false)},
		{Name: "v6 underlay v6 SCTP INIT", In: frame(v6Encap(pktgen.DSROption(sctpVIP6)), sctpInit6),
			Verdict: verdictNext, Check: natted(sctpInit6, sctpVIP6, CounterNATCreated, false)},
		{Name: "client SCTP ABORT marks the entry closing", In: frame(v4Encap(pktgen.DSROption(sctpVIP4)), sctpAbort),
			Verdict: verdictNext, Check: natted(sctpAbort, sctpVIP4, CounterNATClosing, true)},
		{Name: "inner ICMP decapsulated without NAT entry", In: frame(v4Encap(dsr4), echo),
			Verdict: verdictNext, Check: decapped(echo, CounterDecapNoNAT)},

		// lbd's option from a stranger: a spoof, whatever else is wrong with it.
		{Name: "v4 source not allowed", In: frame(encapFrom(strangerV4, 2, dsr4), tcpSyn),
			Verdict: verdictDrop, Check: dropped(CounterDropNotAllowed)},
		{Name: "v6 source not allowed", In: frame(encapFrom(strangerV6, 2, dsr6), tcpSyn6),
			Verdict: verdictDrop, Check: dropped(CounterDropNotAllowed)},
		{Name: "allowed prefix deleted", In: frame(v4Encap(dsr4), tcpSyn), Setup: allowedDeleted,
			Verdict: verdictDrop, Check: dropped(CounterDropNotAllowed)},
		{Name: "malformed DSR option from a stranger", In: frame(encapFrom(strangerV4, 2, badPad), tcpSyn),
			Verdict: verdictDrop, Check: dropped(CounterDropNotAllowed)},
		{Name: "DSR option next to a foreign critical one from a stranger", In: frame(encapFrom(strangerV6, 2, ovn, dsr4), tcpSyn),
			Verdict: verdictDrop, Check: dropped(CounterDropNotAllowed)},

		// lbd's option, broken: ours, so dropped.
		{Name: "unknown critical option", In: frame(v4Encap(ovn, dsr4), tcpSyn),
			Verdict: verdictDrop, Check: dropped(CounterDropUnknownCritical)},
		{Name: "unknown critical option after the DSR option", In: frame(v6Encap(dsr6, ovn), tcpSyn6),
			Verdict: verdictDrop, Check: dropped(CounterDropUnknownCritical)},
		{Name: "DSR option of 3 words", In: frame(v4Encap(pktgen.GeneveOption{Class: pktgen.DSRClass, Type: pktgen.DSRType, Data: make([]byte, 12)}), tcpSyn),
			Verdict: verdictDrop, Check: dropped(CounterDropMalformedOption)},
		{Name: "DSR option padding not zero", In: frame(v4Encap(badPad), tcpSyn),
			Verdict: verdictDrop, Check: dropped(CounterDropMalformedOption)},
		{Name: "DSR option twice", In: frame(v4Encap(dsr4, pktgen.DSROption(vip2V4)), tcpSyn),
			Verdict: verdictDrop, Check: dropped(CounterDropMalformedOption)},
		{Name: "DSR option longer than the option area", In: frame(v4Encap(tooLong), tcpSyn),
			Verdict: verdictDrop, Check: dropped(CounterDropMalformedOption)},
		{Name: "DSR option, then an option longer than the area", In: frame(v4Encap(dsr4, overrun), tcpSyn),
			Verdict: verdictDrop, Check: dropped(CounterDropMalformedOption)},
		{Name: "DSR option, then more options than are walked", In: frame(v4Encap(append([]pktgen.GeneveOption{dsr4}, empties(8)...)...), tcpSyn),
			Verdict: verdictDrop, Check: dropped(CounterDropMalformedOption)},
		{Name: "Geneve OAM packet", In: frame(pktgen.Geneve{Outer: lb4, VNI: 2, Options: []pktgen.GeneveOption{dsr4}, OAM: true}, tcpSyn),
			Verdict: verdictDrop, Check: dropped(CounterDropBadGeneve)},
		{Name: "Geneve protocol not Ethernet", In: frame(pktgen.Geneve{Outer: lb4, VNI: 2, Options: []pktgen.GeneveOption{dsr4}, Protocol: 0x0800}, tcpSyn),
			Verdict: verdictDrop, Check: dropped(CounterDropBadGeneve)},
		{Name: "v4 VIP with an inner IPv6 packet", In: frame(v4Encap(dsr4), tcpSyn6),
			Verdict: verdictDrop, Check: dropped(CounterDropBadInner)},
		{Name: "no inner Ethernet header", In: pktgen.Edit(frame(v4Encap(dsr4), tcpSyn), func(b []byte, o pktgen.Offsets) {
			// End the datagram right behind the options, the lengths made to agree.
			cut := o.Geneve + 8 + 12
			binary.BigEndian.PutUint16(b[o.L3+2:], uint16(cut-o.L3))
			binary.BigEndian.PutUint16(b[o.L4+4:], uint16(cut-o.L4))
		})[:14+20+8+8+12], Verdict: verdictDrop, Check: dropped(CounterDropBadLength)},
		{Name: "inner IPv4 length beyond the datagram", In: pktgen.Edit(frame(v4Encap(dsr4), tcpSyn), put16(func(o pktgen.Offsets) int { return o.InnerL3 + 2 }, 1000)),
			Verdict: verdictDrop, Check: dropped(CounterDropBadLength)},
		{Name: "inner IPv6 payload length beyond the datagram", In: pktgen.Edit(frame(v6Encap(dsr6), tcpSyn6), put16(func(o pktgen.Offsets) int { return o.InnerL3 + 4 }, 1000)),
			Verdict: verdictDrop, Check: dropped(CounterDropBadLength)},
		{Name: "inner TCP header truncated", In: v4Encap(dsr4).Frame(truncateIPv4(tcpSyn.request(), 20+12)),
			Verdict: verdictDrop, Check: dropped(CounterDropBadLength)},
		{Name: "configured VNI accepted", In: frame(pktgen.Geneve{Outer: lb4, VNI: 7, Options: []pktgen.GeneveOption{dsr4}}, tcpSyn), Setup: vni7,
			Verdict: verdictNext, Check: natted(tcpSyn, vipV4, CounterNATCreated, false)},

		// Not lbd's, or not to be told lbd's before its options: another tunnel
		// endpoint's, passed on byte for byte.
		{Name: "default VNI when another is configured", In: frame(v4Encap(dsr4), tcpSyn), Setup: vni7,
			Verdict: verdictNext, Check: untouched(CounterPassForeign)},
		{Name: "foreign option overrunning the option area", In: frame(v4Encap(overrun, dsr4), tcpSyn),
			Verdict: verdictNext, Check: untouched(CounterPassForeign)},
		{Name: "DSR option behind more options than are walked", In: frame(v4Encap(append(empties(8), dsr4)...), tcpSyn),
			Verdict: verdictNext, Check: untouched(CounterPassForeign)},
		{Name: "option area beyond the datagram", In: frame(pktgen.Geneve{Outer: lb4, VNI: 2, Options: []pktgen.GeneveOption{dsr4}, OptLen: 0x3f}, tcpSyn),
			Verdict: verdictNext, Check: untouched(CounterPassForeign)},
		{Name: "Geneve header cut short", In: pktgen.Packet{SrcMAC: lbMAC, DstMAC: nodeMAC, Src: lbV4, Dst: nodeV4, Proto: pktgen.ProtoUDP,
			SrcPort: 49152, DstPort: pktgen.GenevePort, Payload: []byte{0, 0, 0x65, 0x58}}.Frame(),
			Verdict: verdictNext, Check: untouched(CounterPassForeign)},
		{Name: "outer IPv4 length beyond the frame", In: pktgen.Edit(frame(v4Encap(dsr4), tcpSyn), put16(func(o pktgen.Offsets) int { return o.L3 + 2 }, 1400)),
			Verdict: verdictNext, Check: untouched(CounterPassForeign)},
		{Name: "UDP length disagrees with IPv4", In: pktgen.Edit(frame(v4Encap(dsr4), tcpSyn), put16(func(o pktgen.Offsets) int { return o.L4 + 4 }, 60)),
			Verdict: verdictNext, Check: untouched(CounterPassForeign)},
		{Name: "UDP length disagrees with IPv6", In: pktgen.Edit(frame(v6Encap(dsr6), tcpSyn6), put16(func(o pktgen.Offsets) int { return o.L4 + 4 }, 60)),
			Verdict: verdictNext, Check: untouched(CounterPassForeign)},
		{Name: "outer first fragment passes", In: pktgen.Edit(frame(v4Encap(dsr4), tcpSyn), put16(func(o pktgen.Offsets) int { return o.L3 + 6 }, 0x2000)),
			Verdict: verdictNext, Check: untouched(CounterPassFragment)},
	}, foreignCases()...)
}

// foreignCases are Geneve of another tunnel on the same port, from an allowed LB
// source and from anywhere else: another VNI, no option (as Antrea sends), another
// class only (OVN's critical metadata option), lbd's class with another type, another
// Geneve version. The backend node passes each on to the kernel byte for byte.
func foreignCases() []ingressCase {
	dsr4 := pktgen.DSROption(vipV4)
	other := pktgen.GeneveOption{Class: 0x0104, Type: 0x01, Data: []byte{1, 2, 3, 4, 5, 6, 7, 8}}
	kinds := []struct {
		name string
		g    pktgen.Geneve
	}{
		{"another VNI, DSR option", pktgen.Geneve{VNI: 7, Options: []pktgen.GeneveOption{dsr4}}},
		{"another VNI, critical option", pktgen.Geneve{VNI: 5001, Options: []pktgen.GeneveOption{ovn}}},
		{"no option", pktgen.Geneve{VNI: 2}},
		{"another class, critical", pktgen.Geneve{VNI: 2, Options: []pktgen.GeneveOption{ovn}}},
		{"another class, not critical", pktgen.Geneve{VNI: 2, Options: []pktgen.GeneveOption{other}}},
		{"lbd's class, another type", pktgen.Geneve{VNI: 2, Options: []pktgen.GeneveOption{{Class: pktgen.DSRClass, Type: 0x01, Data: dsr4.Data}}}},
		{"another class, IPv4 payload", pktgen.Geneve{VNI: 2, Options: []pktgen.GeneveOption{ovn}, Protocol: 0x0800}},
		{"Geneve version 1, DSR option", pktgen.Geneve{VNI: 2, Options: []pktgen.GeneveOption{dsr4}, Version: 1}},
	}
	var out []ingressCase
	for _, src := range []netip.Addr{lbV4, strangerV4, lbV6, strangerV6} {
		for _, k := range kinds {
			g := k.g
			g.Outer = encapFrom(src, 0).Outer
			g.Outer.SrcPort = 33000 // not the port lbd's LB nodes use, so that it cannot matter
			out = append(out, ingressCase{Name: fmt.Sprintf("from %v: %s", src, k.name), In: g.Frame(tcpSyn.request()),
				Verdict: verdictNext, Check: untouched(CounterPassForeign)})
		}
	}
	return out
}

// truncateIPv4 cuts an IPv4 packet to n bytes and fixes its total length.
func truncateIPv4(ip []byte, n int) []byte {
	out := append([]byte(nil), ip[:n]...)
	binary.BigEndian.PutUint16(out[2:4], uint16(n))
	return out
}

func TestIngress(t *testing.T) {
	pktgen.Run(t, func(t *testing.T) (*Datapath, pktgen.Prog) {
		d := newDatapath(t)
		return d, pktgen.Prog{Program: d.IngressProgram()}
	}, ingressCases())
}

// natted: the frame comes out decapsulated, counted once under counter, and leaves
// the one NAT entry of f, to vip.
func natted(f flow, vip netip.AddrPort, counter Counter, closing bool) func(*testing.T, *Datapath, []byte, []byte) {
	return func(t *testing.T, d *Datapath, in, out []byte) {
		t.Helper()
		checkCounters(t, d, counter)
		checkDecap(t, in, out, f)
		entries := natEntries(t, d)
		if len(entries) != 1 {
			t.Fatalf("NAT entries %+v, want one", entries)
		}
		checkEntry(t, entries[0], f, vip, closing)
	}
}

// decapped: the frame comes out decapsulated, counted once under counter, with no
// NAT entry.
func decapped(f flow, counter Counter) func(*testing.T, *Datapath, []byte, []byte) {
	return func(t *testing.T, d *Datapath, in, out []byte) {
		t.Helper()
		checkCounters(t, d, counter)
		checkDecap(t, in, out, f)
		noNAT(t, d)
	}
}

// dropped: the frame counted once under counter, with no NAT entry.
func dropped(counter Counter) func(*testing.T, *Datapath, []byte, []byte) {
	return func(t *testing.T, d *Datapath, _, _ []byte) {
		t.Helper()
		checkCounters(t, d, counter)
		noNAT(t, d)
	}
}

// untouched: the frame goes on byte for byte as it came, counted once under counter
// and under no other, with no NAT entry.
func untouched(counter Counter) func(*testing.T, *Datapath, []byte, []byte) {
	return func(t *testing.T, d *Datapath, in, out []byte) {
		t.Helper()
		checkCounters(t, d, counter)
		cs, err := d.Counters()
		if err != nil {
			t.Fatal(err)
		}
		for c, v := range cs {
			if c != counter && v != 0 {
				t.Errorf("counter %v = %d, want 0", c, v)
			}
		}
		pktgen.ExpectFrame(t, out, in)
		noNAT(t, d)
	}
}

func natEntries(t *testing.T, d *Datapath) []NATEntry {
	t.Helper()
	entries, err := d.NATEntries()
	if err != nil {
		t.Fatal(err)
	}
	return entries
}

func noNAT(t *testing.T, d *Datapath) {
	t.Helper()
	if entries := natEntries(t, d); len(entries) != 0 {
		t.Fatalf("NAT entries %+v, want none", entries)
	}
}

// checkDecap asserts the output is the outer Ethernet addresses, then the inner
// frame's EtherType and everything behind it byte for byte, and that gopacket reads
// f's addresses from it.
func checkDecap(t *testing.T, in, out []byte, f flow) {
	t.Helper()
	innerType := pktgen.Locate(in).InnerL3 - 2
	pktgen.ExpectFrame(t, out, append(append([]byte(nil), in[:12]...), in[innerType:]...))
	if d := pktgen.Decode(t, out); d.Src() != f.client.Addr() || d.Dst() != f.backend.Addr() {
		t.Fatalf("decapsulated packet %v -> %v, want %v -> %v", d.Src(), d.Dst(), f.client.Addr(), f.backend.Addr())
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
		"UDP to another port": pktgen.Packet{Src: lbV4, Dst: nodeV4, SrcPort: 5353, DstPort: 53, Proto: pktgen.ProtoUDP,
			Payload: []byte("x")}.Frame(),
		"TCP from an LB":           pktgen.Packet{Src: lbV4, Dst: nodeV4, SrcPort: 6081, DstPort: 6081, Flags: pktgen.SYN}.Frame(),
		"IPv6 UDP to another port": pktgen.Packet{Src: lbV6, Dst: nodeV6, SrcPort: 5353, DstPort: 53, Proto: pktgen.ProtoUDP}.Frame(),
		"ARP":                      pktgen.ARPRequest(lbMAC, lbV4, nodeV4),
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
		if v, _ := run(t, d.IngressProgram(), v4Encap(pktgen.DSROption(vip)).Frame(f.request())); v != verdictNext {
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
	ack.flags = pktgen.ACK
	send(ack, vipV4)
	if e := entry(); e.Idle > 5*time.Second || e.VIP != vipV4 {
		t.Errorf("after refresh: idle %v VIP %v", e.Idle, e.VIP)
	}
	send(ack, vip2V4)
	if e := entry(); e.VIP != vip2V4 {
		t.Errorf("after replacement: VIP %v, want %v", e.VIP, vip2V4)
	}
	rst := tcpSyn
	rst.flags = pktgen.RST
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
