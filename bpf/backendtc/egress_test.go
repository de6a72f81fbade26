//go:build linux

package backendtc

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/lbd-dev/lbd/internal/pktgen"
)

// icmpError builds an ICMP or ICMPv6 error frame from src to dst quoting a packet;
// rest is the 4 bytes after the checksum (unused, or the MTU).
func icmpError(src, dst netip.Addr, typ, code uint8, rest uint32, quoted []byte) []byte {
	p := pktgen.Packet{SrcMAC: nodeMAC, DstMAC: lbMAC, Src: src, Dst: dst, Proto: pktgen.ProtoICMPv4,
		ICMPType: typ, ICMPCode: code, ICMPRest: rest, Payload: quoted}
	if src.Is6() {
		p.Proto = pktgen.ProtoICMPv6
	}
	return p.Frame()
}

// egressCase is a frame the backend sends, the NAT entry it meets, and the frame that
// must leave.
type egressCase struct {
	name string
	// flow's request goes through ingress first (creating its NAT entry to vip)
	// unless noEntry.
	flow    flow
	vip     netip.AddrPort
	noEntry bool
	// in is the egress frame (nil: flow's reply from the backend); want is what must
	// leave (nil: in, untouched).
	in, want []byte
	// counter moves by one when want is set; CounterNATClosing also means the entry
	// must be closing afterwards.
	counter Counter
}

func egressCases() []egressCase {
	tcp4 := flow{proto: pktgen.ProtoTCP, client: clientV4, backend: backendV4, flags: pktgen.SYN | pktgen.ACK,
		payload: []byte("hello")}
	tcp6 := flow{proto: pktgen.ProtoTCP, client: clientV6, backend: backendV6, flags: pktgen.SYN | pktgen.ACK,
		payload: []byte("hello6")}
	fin := tcp4
	fin.flags = pktgen.FIN | pktgen.ACK
	rst6 := tcp6
	rst6.flags = pktgen.RST
	odd := udpReq
	odd.payload = []byte("odd") // odd length: the checksum covers a padded byte
	otherPort, otherProto := tcp4, tcp4
	otherPort.client = netip.AddrPortFrom(tcp4.client.Addr(), tcp4.client.Port()+1)
	otherProto.proto = pktgen.ProtoUDP
	vip0 := netip.AddrPortFrom(vipV4.Addr(), 0)
	initAck, initAck6, sctpShutdown := sctpInit, sctpInit6, sctpInit
	initAck.chunk, initAck6.chunk = pktgen.SCTPInitAck, pktgen.SCTPInitAck
	sctpShutdown.chunk, sctpShutdown.payload = pktgen.SCTPShutdownComplete, nil
	noSum := func(f flow, src netip.AddrPort) []byte {
		p := f.reply(src)
		p.NoUDPChecksum = true
		return p.Frame()
	}
	// cut is what the backend's stack quotes of a packet in an ICMP error: n bytes
	// (0: all).
	cut := func(p []byte, n int) []byte {
		if n > 0 {
			p = p[:n]
		}
		return p
	}
	// An error about f from src, and the same error as the client must see it: from
	// the VIP (when it came from the backend address), quoting what the client sent
	// to the VIP.
	icmpCase := func(name string, f flow, vip netip.AddrPort, src netip.Addr, typ, code uint8, rest uint32, n int) egressCase {
		out := src
		if src == f.backend.Addr() {
			out = vip.Addr()
		}
		return egressCase{name: name, flow: f, vip: vip, counter: CounterICMPTranslated,
			in:   icmpError(src, f.client.Addr(), typ, code, rest, cut(f.request(), n)),
			want: icmpError(out, f.client.Addr(), typ, code, rest, cut(f.original(vip), n))}
	}

	return []egressCase{
		{name: "v4 TCP SYN-ACK", flow: tcp4, vip: vipV4, want: tcp4.reply(vipV4).Frame(), counter: CounterSNATDone},
		{name: "v4 UDP", flow: udpReq, vip: vipV4, want: udpReq.reply(vipV4).Frame(), counter: CounterSNATDone},
		{name: "v4 UDP odd length", flow: odd, vip: vipV4, want: odd.reply(vipV4).Frame(), counter: CounterSNATDone},
		{name: "v4 UDP without checksum keeps none", flow: udpReq, vip: vipV4,
			in: noSum(udpReq, backendV4), want: noSum(udpReq, vipV4), counter: CounterSNATDone},
		{name: "v6 TCP SYN-ACK", flow: tcp6, vip: vipV6, want: tcp6.reply(vipV6).Frame(), counter: CounterSNATDone},
		{name: "v6 UDP", flow: udpReq6, vip: vipV6, want: udpReq6.reply(vipV6).Frame(), counter: CounterSNATDone},
		{name: "port 0 service keeps the port", flow: udpReq, vip: vip0,
			want: udpReq.reply(netip.AddrPortFrom(vip0.Addr(), backendV4.Port())).Frame(), counter: CounterSNATDone},
		{name: "v4 FIN marks closing", flow: fin, vip: vipV4, want: fin.reply(vipV4).Frame(), counter: CounterNATClosing},
		{name: "v6 RST marks closing", flow: rst6, vip: vipV6, want: rst6.reply(vipV6).Frame(), counter: CounterNATClosing},
		// SCTP: the address changes, its CRC32c (over no address) stays valid.
		{name: "v4 SCTP INIT ACK", flow: initAck, vip: sctpVIP4, want: initAck.reply(sctpVIP4).Frame(), counter: CounterSNATDone},
		{name: "v6 SCTP INIT ACK", flow: initAck6, vip: sctpVIP6, want: initAck6.reply(sctpVIP6).Frame(), counter: CounterSNATDone},
		{name: "v4 SCTP SHUTDOWN COMPLETE marks closing", flow: sctpShutdown, vip: sctpVIP4,
			want: sctpShutdown.reply(sctpVIP4).Frame(), counter: CounterNATClosing},
		{name: "no entry: untouched", flow: tcp4, vip: vipV4, noEntry: true},
		{name: "other client port: untouched", flow: tcp4, vip: vipV4, in: otherPort.reply(backendV4).Frame()},
		{name: "other protocol on the same ports: untouched", flow: tcp4, vip: vipV4, in: otherProto.reply(backendV4).Frame()},
		{name: "ICMP echo reply: untouched", flow: tcp4, vip: vipV4,
			in: icmpError(backendV4.Addr(), clientV4.Addr(), 0, 0, 0x00070001, nil)},

		icmpCase("ICMP port unreachable for UDP", udpReq, vipV4, backendV4.Addr(), 3, 3, 0, 0),
		icmpCase("ICMP fragmentation needed for TCP", tcp4, vipV4, backendV4.Addr(), 3, 4, 1400, 0),
		icmpCase("ICMP quoting 8 bytes of TCP", tcp4, vipV4, backendV4.Addr(), 3, 4, 1400, 28),
		icmpCase("ICMP from a router address keeps its source", tcp4, vipV4, routerV4, 11, 0, 0, 0),
		icmpCase("ICMPv6 packet too big for TCP", tcp6, vipV6, backendV6.Addr(), 2, 0, 1280, 0),
		icmpCase("ICMPv6 port unreachable for UDP", udpReq6, vipV6, backendV6.Addr(), 1, 4, 0, 0),
		icmpCase("ICMP fragmentation needed for SCTP", sctpInit, sctpVIP4, backendV4.Addr(), 3, 4, 1400, 0),
		icmpCase("ICMPv6 packet too big for SCTP", sctpInit6, sctpVIP6, backendV6.Addr(), 2, 0, 1280, 0),
		{name: "ICMP error about another flow: untouched", flow: udpReq, vip: vipV4, noEntry: true,
			in: icmpError(backendV4.Addr(), clientV4.Addr(), 3, 3, 0, udpReq.request())},
	}
}

// TestEgressSCTPPortNotRewritten: an SCTP reply whose NAT entry names another port
// than the backend's is dropped and counted, never sent with a CRC32c that no longer
// verifies. (The control plane refuses such services; this is the datapath's guard.)
func TestEgressSCTPPortNotRewritten(t *testing.T) {
	d := newDatapath(t)
	data := sctpInit
	data.chunk, data.payload = pktgen.SCTPHeartbeat, []byte{0, 1, 0, 8, 1, 2, 3, 4}
	if v, _ := run(t, d.IngressProgram(), v4Encap(pktgen.DSROption(vipV4)).Frame(data.request())); v != verdictNext {
		t.Fatalf("ingress verdict %#x", v)
	}
	before, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := run(t, d.EgressProgram(), data.reply(data.backend).Frame()); v != verdictDrop {
		t.Errorf("verdict %#x, want TCX_DROP", v)
	}
	after, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if n := after[CounterDropSNATFailed] - before[CounterDropSNATFailed]; n != 1 {
		t.Errorf("%v moved by %d, want 1", CounterDropSNATFailed, n)
	}
}

func TestEgress(t *testing.T) {
	for _, tc := range egressCases() {
		t.Run(tc.name, func(t *testing.T) {
			d := newDatapath(t)
			if !tc.noEntry {
				// The entry is made by a plain segment, so that only the reply
				// under test can mark it closing.
				req := tc.flow
				req.flags = pktgen.ACK
				if req.proto == pktgen.ProtoSCTP {
					req.chunk, req.payload = pktgen.SCTPHeartbeat, []byte{0, 1, 0, 8, 1, 2, 3, 4}
				}
				if v, _ := run(t, d.IngressProgram(), v4Encap(pktgen.DSROption(tc.vip)).Frame(req.request())); v != verdictNext {
					t.Fatalf("ingress verdict %#x", v)
				}
			}
			before, err := d.Counters()
			if err != nil {
				t.Fatal(err)
			}
			in := tc.in
			if in == nil {
				in = tc.flow.reply(tc.flow.backend).Frame()
			}
			verdict, out := run(t, d.EgressProgram(), in)
			if verdict != verdictNext {
				t.Errorf("verdict %#x, want TCX_NEXT", verdict)
			}
			want := in
			if tc.want != nil {
				want = tc.want
			}
			pktgen.ExpectFrame(t, out, want)
			// Checksums by recomputation, independently of the expected frame.
			if err := pktgen.VerifyIP(out[14:]); err != nil {
				t.Errorf("output: %v", err)
			}
			checkDecoded(t, out, tc)

			after, err := d.Counters()
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range AllCounters() {
				delta := after[c] - before[c]
				switch {
				case tc.want != nil && c == tc.counter && delta != 1:
					t.Errorf("counter %v moved by %d, want 1", c, delta)
				case c >= CounterDropNotAllowed && delta != 0:
					t.Errorf("drop counter %v moved by %d", c, delta)
				case tc.want == nil && delta != 0:
					t.Errorf("counter %v moved by %d on an untouched packet", c, delta)
				}
			}
			if tc.noEntry {
				return
			}
			e, err := d.LookupNAT(NATKey{Proto: Proto(tc.flow.proto), Backend: tc.flow.backend, Client: tc.flow.client})
			if err != nil {
				t.Fatal(err)
			}
			if closing := tc.counter == CounterNATClosing; e.Closing != closing {
				t.Errorf("closing %v, want %v", e.Closing, closing)
			}
		})
	}
}

// checkDecoded reads the output with gopacket: a SNAT'ed reply comes from VIP:port,
// and a translated ICMP error quotes a packet to VIP:port.
func checkDecoded(t *testing.T, out []byte, tc egressCase) {
	t.Helper()
	if tc.want == nil {
		return
	}
	d := pktgen.Parse(out)
	vip := tc.vip
	if vip.Port() == 0 {
		vip = netip.AddrPortFrom(vip.Addr(), tc.flow.backend.Port())
	}
	if tc.counter == CounterICMPTranslated {
		// The quoted packet is the ICMP payload; decode it as an IP packet.
		var quoted []byte
		if d.ICMPv4 != nil {
			quoted = d.ICMPv4.Payload
		} else if d.ICMPv6 != nil {
			quoted = d.ICMPv6.Payload[4:]
		}
		q := pktgen.ParseIP(quoted)
		if q.Dst() != vip.Addr() {
			t.Errorf("quoted packet %v, want destination %v", q.Packet, vip.Addr())
		}
		// The quote may stop 8 bytes into TCP, too short for gopacket's TCP layer.
		l4 := 40
		if q.IPv4 != nil {
			l4 = int(q.IPv4.IHL) * 4
		}
		if got := binary.BigEndian.Uint16(quoted[l4+2:]); got != vip.Port() {
			t.Errorf("quoted destination port %d, want %d", got, vip.Port())
		}
		return
	}
	var src uint16
	switch {
	case d.TCP != nil:
		src = uint16(d.TCP.SrcPort)
	case d.UDP != nil:
		src = uint16(d.UDP.SrcPort)
	case d.SCTP != nil:
		src = uint16(d.SCTP.SrcPort)
	default:
		t.Fatalf("decode output: %v", d.Packet)
	}
	if got := netip.AddrPortFrom(d.Src(), src); got != vip {
		t.Errorf("reply from %v, want %v", got, vip)
	}
}

// onesSum is the ones' complement sum of b in 16-bit words, folded (RFC 1071); an odd
// last byte is padded with a zero. It is this test's own arithmetic, shared with
// neither the program nor pktgen.
func onesSum(b []byte) uint16 {
	var s uint32
	for i := 0; i < len(b); i += 2 {
		w := uint32(b[i]) << 8
		if i+1 < len(b) {
			w |= uint32(b[i+1])
		}
		s += w
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// udpSum is the ones' complement sum of a UDP datagram from src to dst carrying
// payload, its checksum field 0, and its pseudo-header (RFC 768, RFC 8200 §8.1).
func udpSum(src, dst netip.AddrPort, payload []byte) uint16 {
	n := 8 + len(payload)
	b := append(src.Addr().AsSlice(), dst.Addr().AsSlice()...)
	if src.Addr().Is4() {
		b = append(b, 0, pktgen.ProtoUDP, byte(n>>8), byte(n))
	} else {
		b = binary.BigEndian.AppendUint32(b, uint32(n))
		b = append(b, 0, 0, 0, pktgen.ProtoUDP)
	}
	b = binary.BigEndian.AppendUint16(b, src.Port())
	b = binary.BigEndian.AppendUint16(b, dst.Port())
	b = binary.BigEndian.AppendUint16(b, uint16(n))
	b = append(b, 0, 0)
	return onesSum(append(b, payload...))
}

// zeroSumPayload returns prefix (of even length) and a last word chosen so that the
// checksum of a UDP datagram from src to dst carrying it computes to exactly 0: the
// sum of everything it covers is 0xffff, whose complement is 0.
func zeroSumPayload(t *testing.T, src, dst netip.AddrPort, prefix []byte) []byte {
	t.Helper()
	if len(prefix)%2 != 0 {
		t.Fatalf("prefix of odd length %d", len(prefix))
	}
	p := append(append([]byte(nil), prefix...), 0, 0)
	binary.BigEndian.PutUint16(p[len(p)-2:], ^udpSum(src, dst, p))
	if s := udpSum(src, dst, p); ^s != 0 {
		t.Fatalf("payload %x: the checksum computes to %#04x, not 0", p, ^s)
	}
	return p
}

// TestEgressUDPChecksumZero sends UDP whose checksum, once the egress program has
// rewritten it, computes to exactly 0. It must leave as 0xffff: a UDP checksum of 0
// means "none" (RFC 768), and over IPv6 a receiver must drop it (RFC 8200 §8.1). The
// reply's source becomes VIP:port; an ICMP error's quoted request gets VIP:port as
// its destination again, so its checksum must read as the client sent it, and the
// client sent a computed 0 as 0xffff.
func TestEgressUDPChecksumZero(t *testing.T) {
	for _, tc := range []struct {
		name     string
		udp      flow
		vip      netip.AddrPort
		icmp     bool
		icmpType uint8
		icmpCode uint8
	}{
		{name: "IPv6 reply", udp: udpReq6, vip: vipV6},
		{name: "IPv4 reply", udp: udpReq, vip: vipV4},
		{name: "ICMPv6 port unreachable quoting the request", udp: udpReq6, vip: vipV6, icmp: true, icmpType: 1, icmpCode: 4},
		{name: "ICMP port unreachable quoting the request", udp: udpReq, vip: vipV4, icmp: true, icmpType: 3, icmpCode: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.udp
			var in, want []byte
			l3 := 20
			if f.client.Addr().Is6() {
				l3 = 40
			}
			// Where the UDP checksum that must read 0xffff on the way out is: in the
			// reply, or in the packet the ICMP error quotes.
			udpAt := 14 + l3
			if !tc.icmp {
				f.payload = zeroSumPayload(t, tc.vip, f.client, []byte("reply!"))
				in, want = f.reply(f.backend).Frame(), f.reply(tc.vip).Frame()
			} else {
				f.payload = zeroSumPayload(t, f.client, tc.vip, []byte("query!"))
				in = icmpError(f.backend.Addr(), f.client.Addr(), tc.icmpType, tc.icmpCode, 0, f.request())
				want = icmpError(tc.vip.Addr(), f.client.Addr(), tc.icmpType, tc.icmpCode, 0, f.original(tc.vip))
				udpAt += 8 + l3
			}
			if err := pktgen.VerifyIP(in[14:]); err != nil {
				t.Fatalf("input: %v", err)
			}

			d := newDatapath(t)
			if v, _ := run(t, d.IngressProgram(), v4Encap(pktgen.DSROption(tc.vip)).Frame(f.request())); v != verdictNext {
				t.Fatalf("ingress verdict %#x", v)
			}
			verdict, out := run(t, d.EgressProgram(), in)
			if verdict != verdictNext {
				t.Errorf("verdict %#x, want TCX_NEXT", verdict)
			}
			if got := binary.BigEndian.Uint16(out[udpAt+6:]); got != 0xffff {
				t.Errorf("UDP checksum %#04x, want 0xffff", got)
			}
			if err := pktgen.VerifyIP(out[14:]); err != nil {
				t.Errorf("output: %v", err)
			}
			if tc.icmp {
				// The quote is whole: its own checksums verify too.
				if err := pktgen.VerifyIP(out[14+l3+8:]); err != nil {
					t.Errorf("quoted packet: %v", err)
				}
			}
			pktgen.ExpectFrame(t, out, want)
		})
	}
}
