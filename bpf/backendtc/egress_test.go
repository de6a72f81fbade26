//go:build linux

package backendtc

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"strconv"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/lbd-dev/lbd/internal/testnet"
)

// icmpError builds an ICMP or ICMPv6 error frame from src to dst quoting a packet;
// rest is the 4 bytes after the checksum (unused, or the MTU).
func icmpError(tb testing.TB, src, dst netip.Addr, typ, code uint8, rest uint32, quoted []byte) []byte {
	tb.Helper()
	var restB [4]byte
	binary.BigEndian.PutUint32(restB[:], rest)
	if src.Is4() {
		ip := ipLayer(src, dst, layers.IPProtocolICMPv4).(*layers.IPv4)
		icmp := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(typ, code),
			Id: uint16(rest >> 16), Seq: uint16(rest)}
		return ethFrame(nodeMAC, lbMAC, serialize(tb, ip, icmp, gopacket.Payload(quoted)))
	}
	ip := ipLayer(src, dst, layers.IPProtocolICMPv6).(*layers.IPv6)
	icmp := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(typ, code)}
	if err := icmp.SetNetworkLayerForChecksum(ip); err != nil {
		tb.Fatal(err)
	}
	return ethFrame(nodeMAC, lbMAC, serialize(tb, ip, icmp,
		gopacket.Payload(append(restB[:], quoted...))))
}

// zeroUDPChecksum clears the UDP checksum of an Ethernet+IPv4+UDP frame.
func zeroUDPChecksum(f []byte) []byte {
	out := append([]byte(nil), f...)
	hl := int(out[14]&0x0f) * 4
	out[14+hl+6], out[14+hl+7] = 0, 0
	return out
}

type egressCase struct {
	name string
	// flow's request goes through ingress first (creating its NAT entry to vip)
	// unless noEntry.
	flow    flow
	vip     netip.AddrPort
	noEntry bool
	// in builds the egress frame and want the expected output; nil in means
	// flow.reply, nil want means the frame must leave unchanged.
	in, want func(tb testing.TB, c egressCase) []byte
	counter  Counter
	closing  bool
}

// snatted is flow's reply as if the backend had answered from the VIP itself: the
// exact frame SNAT must produce.
func snatted(tb testing.TB, c egressCase) []byte {
	f := c.flow
	f.backend = c.vip
	return f.reply(tb)
}

func egressCases() []egressCase {
	synAck := tcpFlags{SYN: true, ACK: true}
	tcp4 := flow{proto: layers.IPProtocolTCP, client: clientV4, backend: backendV4, flags: synAck,
		payload: []byte("hello")}
	tcp6 := flow{proto: layers.IPProtocolTCP, client: clientV6, backend: backendV6, flags: synAck,
		payload: []byte("hello6")}
	fin := tcp4
	fin.flags = tcpFlags{FIN: true, ACK: true}
	rst6 := tcp6
	rst6.flags = tcpFlags{RST: true}
	odd := udpReq
	odd.payload = []byte("odd") // odd length: the checksum covers a padded byte

	// quote is what the backend's stack quotes in an ICMP error: the request as it
	// arrived (to the backend), cut to n bytes (0: whole).
	quote := func(tb testing.TB, f flow, n int) []byte {
		p := f.request(tb)
		if n > 0 {
			p = p[:n]
		}
		return p
	}
	// translated is the same error as the client must see it: from the VIP (when it
	// came from the backend address), quoting what the client sent to the VIP.
	icmpCase := func(name string, f flow, vip netip.AddrPort, src netip.Addr, typ, code uint8,
		rest uint32, n int) egressCase {
		return egressCase{name: name, flow: f, vip: vip, counter: CounterICMPTranslated,
			in: func(tb testing.TB, c egressCase) []byte {
				return icmpError(tb, src, f.client.Addr(), typ, code, rest, quote(tb, f, n))
			},
			want: func(tb testing.TB, c egressCase) []byte {
				out := src
				if src == f.backend.Addr() {
					out = vip.Addr()
				}
				q := f.original(tb, vip)
				if n > 0 {
					q = q[:n]
				}
				return icmpError(tb, out, f.client.Addr(), typ, code, rest, q)
			}}
	}

	return []egressCase{
		{name: "v4 TCP SYN-ACK", flow: tcp4, vip: vipV4, want: snatted, counter: CounterSNATDone},
		{name: "v4 UDP", flow: udpReq, vip: vipV4, want: snatted, counter: CounterSNATDone},
		{name: "v4 UDP odd length", flow: odd, vip: vipV4, want: snatted, counter: CounterSNATDone},
		{name: "v4 UDP without checksum keeps none", flow: udpReq, vip: vipV4,
			in: func(tb testing.TB, c egressCase) []byte { return zeroUDPChecksum(c.flow.reply(tb)) },
			want: func(tb testing.TB, c egressCase) []byte {
				return zeroUDPChecksum(snatted(tb, c))
			},
			counter: CounterSNATDone},
		{name: "v6 TCP SYN-ACK", flow: tcp6, vip: vipV6, want: snatted, counter: CounterSNATDone},
		{name: "v6 UDP", flow: udpReq6, vip: vipV6, want: snatted, counter: CounterSNATDone},
		{name: "port 0 service keeps the port", flow: udpReq,
			vip: netip.AddrPortFrom(vipV4.Addr(), 0), want: func(tb testing.TB, c egressCase) []byte {
				c.vip = netip.AddrPortFrom(vipV4.Addr(), backendV4.Port())
				return snatted(tb, c)
			}, counter: CounterSNATDone},
		{name: "v4 FIN marks closing", flow: fin, vip: vipV4, want: snatted,
			counter: CounterNATClosing, closing: true},
		{name: "v6 RST marks closing", flow: rst6, vip: vipV6, want: snatted,
			counter: CounterNATClosing, closing: true},
		{name: "no entry: untouched", flow: tcp4, vip: vipV4, noEntry: true},
		{name: "other client port: untouched", flow: tcp4, vip: vipV4,
			in: func(tb testing.TB, c egressCase) []byte {
				f := c.flow
				f.client = netip.AddrPortFrom(f.client.Addr(), f.client.Port()+1)
				return f.reply(tb)
			}},
		{name: "other protocol on the same ports: untouched", flow: tcp4, vip: vipV4,
			in: func(tb testing.TB, c egressCase) []byte {
				f := c.flow
				f.proto = layers.IPProtocolUDP
				return f.reply(tb)
			}},
		{name: "ICMP echo reply: untouched", flow: tcp4, vip: vipV4,
			in: func(tb testing.TB, c egressCase) []byte {
				return icmpError(tb, backendV4.Addr(), clientV4.Addr(), 0, 0, 0x00070001, nil)
			}},

		icmpCase("ICMP port unreachable for UDP", udpReq, vipV4, backendV4.Addr(), 3, 3, 0, 0),
		icmpCase("ICMP fragmentation needed for TCP", tcp4, vipV4, backendV4.Addr(), 3, 4, 1400, 0),
		icmpCase("ICMP quoting 8 bytes of TCP", tcp4, vipV4, backendV4.Addr(), 3, 4, 1400, 28),
		icmpCase("ICMP from a router address keeps its source", tcp4, vipV4, routerV4, 11, 0, 0, 0),
		icmpCase("ICMPv6 packet too big for TCP", tcp6, vipV6, backendV6.Addr(), 2, 0, 1280, 0),
		icmpCase("ICMPv6 port unreachable for UDP", udpReq6, vipV6, backendV6.Addr(), 1, 4, 0, 0),
		{name: "ICMP error about another flow: untouched", flow: udpReq, vip: vipV4, noEntry: true,
			in: func(tb testing.TB, c egressCase) []byte {
				return icmpError(tb, backendV4.Addr(), clientV4.Addr(), 3, 3, 0, quote(tb, c.flow, 0))
			}},
	}
}

func TestEgress(t *testing.T) {
	testnet.Require(t)
	for _, tc := range egressCases() {
		t.Run(tc.name, func(t *testing.T) {
			d := newDatapath(t)
			if !tc.noEntry {
				// The entry is made by a plain segment, so that only the reply
				// under test can mark it closing.
				req := tc.flow
				req.flags = tcpFlags{ACK: true}
				frame := v4Encap(dsrOpt(tc.vip)).frame(t, req.request(t))
				if v, _ := run(t, d.IngressProgram(), frame); v != verdictNext {
					t.Fatalf("ingress verdict %#x", v)
				}
			}
			before, err := d.Counters()
			if err != nil {
				t.Fatal(err)
			}
			in := tc.flow.reply(t)
			if tc.in != nil {
				in = tc.in(t, tc)
			}
			verdict, out := run(t, d.EgressProgram(), in)
			if verdict != verdictNext {
				t.Errorf("verdict %#x, want TCX_NEXT", verdict)
			}
			want := in
			if tc.want != nil {
				want = tc.want(t, tc)
			}
			if !bytes.Equal(out, want) {
				t.Errorf("egress frame:\n got %x\nwant %x", out, want)
			}
			// Checksums by recomputation, independently of the expected frame.
			if err := checkIPPacket(out[14:]); err != nil {
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
			e, err := d.LookupNAT(NATKey{Proto: Proto(tc.flow.proto), Backend: tc.flow.backend,
				Client: tc.flow.client})
			if err != nil {
				t.Fatal(err)
			}
			if e.Closing != tc.closing {
				t.Errorf("closing %v, want %v", e.Closing, tc.closing)
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
	pkt := gopacket.NewPacket(out, layers.LayerTypeEthernet, gopacket.Default)
	vip := tc.vip
	if vip.Port() == 0 {
		vip = netip.AddrPortFrom(vip.Addr(), tc.flow.backend.Port())
	}
	if tc.counter == CounterICMPTranslated {
		// The quoted packet is the ICMP payload; decode it as an IP packet.
		var quoted []byte
		if l := pkt.Layer(layers.LayerTypeICMPv4); l != nil {
			quoted = l.LayerPayload()
		} else if l := pkt.Layer(layers.LayerTypeICMPv6); l != nil {
			quoted = l.LayerPayload()[4:]
		}
		first := layers.LayerTypeIPv4
		if vip.Addr().Is6() {
			first = layers.LayerTypeIPv6
		}
		q := gopacket.NewPacket(quoted, first, gopacket.Default)
		if nl := q.NetworkLayer(); nl == nil || nl.NetworkFlow().Dst().String() != vip.Addr().String() {
			t.Errorf("quoted packet %v, want destination %v", q, vip.Addr())
		}
		// The quote may stop 8 bytes into TCP, too short for gopacket's TCP layer.
		l4 := len(quoted) - len(q.NetworkLayer().LayerPayload())
		if got := binary.BigEndian.Uint16(quoted[l4+2:]); got != vip.Port() {
			t.Errorf("quoted destination port %d, want %d", got, vip.Port())
		}
		return
	}
	nl, tl := pkt.NetworkLayer(), pkt.TransportLayer()
	if nl == nil || tl == nil {
		t.Fatalf("decode output: %v", pkt)
	}
	if nl.NetworkFlow().Src().String() != vip.Addr().String() ||
		tl.TransportFlow().Src().String() != strconv.Itoa(int(vip.Port())) {
		t.Errorf("reply from %v:%v, want %v", nl.NetworkFlow().Src(), tl.TransportFlow().Src(), vip)
	}
}
