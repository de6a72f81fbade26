//go:build linux

package integration

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/pktgen"
	"github.com/lbd-dev/lbd/internal/testnet"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// sctpPort is the SCTP service's port (S1AP's); SCTP backends listen on the same.
const sctpPort = 36412

// sctpPacket is an SCTP packet with one chunk, its CRC32c computed by pktgen (this
// kernel has no SCTP sockets: the test plays both ends with raw sockets).
func sctpPacket(sport, dport uint16, vtag uint32, chunk uint8, value []byte) []byte {
	b := binary.BigEndian.AppendUint16(nil, sport)
	b = binary.BigEndian.AppendUint16(b, dport)
	b = binary.BigEndian.AppendUint32(b, vtag)
	b = append(b, 0, 0, 0, 0, chunk, 0, 0, 0)
	binary.BigEndian.PutUint16(b[14:], uint16(4+len(value)))
	b = append(b, value...)
	b = append(b, make([]byte, -len(value)&3)...)
	pktgen.SetSCTPChecksum(b)
	return b
}

// initValue is an INIT or INIT ACK chunk's value: initiate tag, window, streams, TSN.
func initValue(tag uint32) []byte {
	v := binary.BigEndian.AppendUint32(nil, tag)
	v = binary.BigEndian.AppendUint32(v, 65535)
	v = binary.BigEndian.AppendUint32(v, 1<<16|1)
	return binary.BigEndian.AppendUint32(v, 1)
}

// sctpSeen is one SCTP packet a raw socket read: where, from whom, what.
type sctpSeen struct {
	at    string // node name
	from  netip.AddrPort
	chunk uint8
	vtag  uint32
	crcOK bool
}

// sctpEnd is a raw SCTP socket in a namespace and what it has read.
type sctpEnd struct {
	name string
	conn *net.IPConn
	mu   sync.Mutex
	seen []sctpSeen
}

func openSCTP(t *testing.T, name string, ns *testnet.NS) *sctpEnd {
	t.Helper()
	e := &sctpEnd{name: name}
	ns.Do(t, func() {
		c, err := net.ListenIP("ip4:132", &net.IPAddr{})
		if err != nil {
			t.Fatalf("%s: raw SCTP socket: %v", name, err)
		}
		e.conn = c
	})
	t.Cleanup(func() { e.conn.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := e.conn.ReadFromIP(buf)
			if err != nil {
				return
			}
			p := buf[:n]
			if n < 16 {
				continue
			}
			a, _ := netip.AddrFromSlice(from.IP.To4())
			e.mu.Lock()
			e.seen = append(e.seen, sctpSeen{at: name, from: netip.AddrPortFrom(a, binary.BigEndian.Uint16(p)),
				chunk: p[12], vtag: binary.BigEndian.Uint32(p[4:]),
				crcOK: binary.LittleEndian.Uint32(p[8:]) == pktgen.SCTPChecksum(p)})
			e.mu.Unlock()
		}
	}()
	return e
}

func (e *sctpEnd) send(t *testing.T, to netip.Addr, pkt []byte) {
	t.Helper()
	if _, err := e.conn.WriteToIP(pkt, &net.IPAddr{IP: to.AsSlice()}); err != nil {
		t.Fatalf("%s: send SCTP to %v: %v", e.name, to, err)
	}
}

// take removes and returns what the ends read from `from` with that chunk type.
func take(ends []*sctpEnd, from netip.AddrPort, chunk uint8) []sctpSeen {
	var got []sctpSeen
	for _, e := range ends {
		e.mu.Lock()
		kept := e.seen[:0]
		for _, s := range e.seen {
			if s.from == from && s.chunk == chunk {
				got = append(got, s)
			} else {
				kept = append(kept, s)
			}
		}
		e.seen = kept
		e.mu.Unlock()
	}
	return got
}

// expectOne waits until exactly one packet from `from` with that chunk arrived at any
// of the ends, and returns it.
func expectOne(t *testing.T, ends []*sctpEnd, from netip.AddrPort, chunk uint8) sctpSeen {
	t.Helper()
	var got []sctpSeen
	deadline := time.Now().Add(3 * time.Second)
	for len(got) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		got = append(got, take(ends, from, chunk)...)
	}
	time.Sleep(20 * time.Millisecond) // a duplicate elsewhere would show now
	got = append(got, take(ends, from, chunk)...)
	if len(got) != 1 {
		t.Fatalf("chunk %d from %v: arrived %d times (%+v), want once", chunk, from, len(got), got)
	}
	if !got[0].crcOK {
		t.Errorf("chunk %d from %v at %s: CRC32c does not verify", chunk, from, got[0].at)
	}
	return got[0]
}

// TestSCTP: an SCTP service and a UDP service on the same VIP and port, through the
// whole topology with crafted packets (no SCTP sockets here): each protocol reaches
// its own backends; every packet of an association reaches the backend its INIT got,
// also after a backend joins mid-association; the backend node gets correct Geneve
// (DSR option VIP:port, inner packet to the backend, CRC32c valid) and its replies
// leave from VIP:port with a CRC32c that verifies (computed here, independently of
// the datapath, which never computes one).
func TestSCTP(t *testing.T) {
	tb := newTestbed(t, options{})
	tb.startLBD()
	be1, be2, be3 := tb.backends[0], tb.backends[1], tb.backends[2]
	at := func(be *node) string { return netip.AddrPortFrom(be.addr4, sctpPort).String() }
	tb.createService(t, svcSpec{"s1ap", vip4, sctpPort, "sctp", []string{at(be1), at(be2)}})
	tb.createService(t, svcSpec{"s1ap-udp", vip4, sctpPort, "udp", []string{at(be3)}})

	caps := map[string]*testnet.Capture{}
	for _, be := range tb.backends {
		caps[be.name] = be.ns.Capture(t, be.ifc)
	}
	client := openSCTP(t, "client", tb.clientNS)
	ends := map[string]*sctpEnd{}
	var beEnds []*sctpEnd
	for _, be := range tb.backends {
		ends[be.name] = openSCTP(t, be.name, be.ns)
		beEnds = append(beEnds, ends[be.name])
	}
	nodeOf := map[string]*node{be1.name: be1, be2.name: be2, be3.name: be3}

	// UDP on the same VIP and port reaches the UDP service's backend only.
	var udpConn net.PacketConn
	be3.ns.Do(t, func() {
		var err error
		if udpConn, err = net.ListenPacket("udp4", netip.AddrPortFrom(be3.addr4, sctpPort).String()); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { udpConn.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := udpConn.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = udpConn.WriteTo(append([]byte(be3.name+" "+from.String()+" "), buf[:n]...), from)
		}
	}()
	for range 6 {
		c, err := dialIn(context.Background(), tb.clientNS, "udp4", netip.AddrPortFrom(vip4, sctpPort).String())
		if err != nil {
			t.Fatal(err)
		}
		if a, err := ask(c, "udp"); err != nil || a.backend != be3.name {
			t.Errorf("UDP to %v:%d: answer %+v, %v; want one from %s, the UDP service's backend", vip4, sctpPort, a, err, be3.name)
		}
		c.Close()
	}

	// Associations: the handshake's first half on two backends.
	const n = 12
	type assoc struct {
		local   netip.AddrPort
		backend string
		tag     uint32 // the backend's verification tag
	}
	as := make([]assoc, n)
	for i := range as {
		a := &as[i]
		a.local = netip.AddrPortFrom(client4, uint16(tb.nextClientPort()))
		client.send(t, vip4, sctpPacket(a.local.Port(), sctpPort, 0, pktgen.SCTPInit, initValue(0x1000+uint32(i))))
		got := expectOne(t, beEnds, a.local, pktgen.SCTPInit)
		if got.at == be3.name {
			t.Fatalf("INIT from %v reached %s, the UDP service's backend", a.local, got.at)
		}
		a.backend, a.tag = got.at, 0x2000+uint32(i)
		be := nodeOf[a.backend]
		ends[a.backend].send(t, client4, sctpPacket(sctpPort, a.local.Port(), 0x1000+uint32(i), pktgen.SCTPInitAck, initValue(a.tag)))
		if r := expectOne(t, []*sctpEnd{client}, netip.AddrPortFrom(vip4, sctpPort), pktgen.SCTPInitAck); r.vtag != 0x1000+uint32(i) {
			t.Fatalf("INIT ACK of %v from %s: verification tag %#x", a.local, be.name, r.vtag)
		}
	}

	// A backend joins mid-association: the table changes, no association moves.
	tb.lbctlLBs(t, "backend", "add", "s1ap", at(be3))
	tb.waitSlots(t, "s1ap", netip.AddrPortFrom(be3.addr4, sctpPort), func(s uint32) bool { return s > 0 })
	moved := 0
	for i, a := range as {
		steps := []struct{ chunk, reply uint8 }{
			{pktgen.SCTPCookieEcho, pktgen.SCTPCookieAck},
			{pktgen.SCTPData, pktgen.SCTPSack},
			{pktgen.SCTPData, pktgen.SCTPSack},
			{pktgen.SCTPShutdown, pktgen.SCTPShutdownAck},
			{pktgen.SCTPShutdownComplete, 0},
		}
		for _, s := range steps {
			val := pktgen.Bytes(16)
			if s.chunk == pktgen.SCTPShutdownComplete {
				val = nil
			}
			client.send(t, vip4, sctpPacket(a.local.Port(), sctpPort, a.tag, s.chunk, val))
			got := expectOne(t, beEnds, a.local, s.chunk)
			if got.at != a.backend {
				moved++
				t.Errorf("association %d from %v: chunk %d reached %s, its INIT %s", i, a.local, s.chunk, got.at, a.backend)
				break
			}
			if got.vtag != a.tag {
				t.Errorf("association %d: chunk %d arrived with verification tag %#x, want %#x", i, s.chunk, got.vtag, a.tag)
			}
			if s.reply == 0 {
				continue
			}
			ends[a.backend].send(t, client4, sctpPacket(sctpPort, a.local.Port(), 0x1000+uint32(i), s.reply, pktgen.Bytes(12)))
			expectOne(t, []*sctpEnd{client}, netip.AddrPortFrom(vip4, sctpPort), s.reply)
		}
	}
	if moved > 0 {
		t.Fatalf("%d of %d associations moved when a backend joined", moved, n)
	}

	// What the backend nodes' uplinks carried: lbd's Geneve in, SNAT'ed SCTP out.
	checkSCTPFrames(t, caps, tb.backends)

	// lbctl shows the associations and traces SCTP like the others.
	sctpFlows := 0
	for _, lb := range tb.lbs {
		for _, c := range lb.lbd.connections(t) {
			if c.GetProtocol() == lbdv1.Protocol_PROTOCOL_SCTP && c.GetVipPort() == sctpPort {
				sctpFlows++
			}
		}
	}
	if sctpFlows != n {
		t.Errorf("LB nodes' conntrack lists %d SCTP flows, want %d", sctpFlows, n)
	}
	out := tb.lbs[0].lbd.lbctl(t, "trace", "sctp", client4.String(), "50000", vip4.String(), fmt.Sprint(sctpPort))
	if !strings.Contains(out, "s1ap") || strings.Contains(out, "s1ap-udp") {
		t.Errorf("lbctl trace sctp names another service than s1ap:\n%s", out)
	}
	t.Logf("lbctl trace sctp:\n%s", out)
}

// checkSCTPFrames reads the backend nodes' captures: every SCTP packet that came in
// inside Geneve carries the DSR option of the VIP and port and is addressed to the
// node's own address and the same port with a valid CRC32c; every SCTP packet that
// left comes from VIP:port with a valid CRC32c.
func checkSCTPFrames(t *testing.T, caps map[string]*testnet.Capture, backends []*node) {
	t.Helper()
	in, out := 0, 0
	wantOpt := pktgen.DSROption(netip.AddrPortFrom(vip4, sctpPort))
	for _, be := range backends {
		for _, f := range caps[be.name].Stop() {
			d := pktgen.Parse(f.Data)
			switch {
			case !f.Outgoing && d.Geneve != nil && d.Inner.SCTP != nil:
				in++
				if len(d.Geneve.Options) != 1 || d.Geneve.Options[0].Class != wantOpt.Class ||
					string(d.Geneve.Options[0].Data) != string(wantOpt.Data) {
					t.Errorf("%s: Geneve options %+v, want the DSR option of %v:%d", be.name, d.Geneve.Options, vip4, sctpPort)
				}
				if d.Inner.Dst() != be.addr4 || uint16(d.Inner.SCTP.DstPort) != sctpPort {
					t.Errorf("%s: inner SCTP to %v:%d", be.name, d.Inner.Dst(), d.Inner.SCTP.DstPort)
				}
				if err := pktgen.VerifyIP(d.Inner.IP); err != nil {
					t.Errorf("%s: inner SCTP: %v", be.name, err)
				}
			case f.Outgoing && d.SCTP != nil:
				out++
				if d.Src() != vip4 || uint16(d.SCTP.SrcPort) != sctpPort {
					t.Errorf("%s: SCTP left from %v:%d, want %v:%d", be.name, d.Src(), d.SCTP.SrcPort, vip4, sctpPort)
				}
				if err := pktgen.VerifyIP(d.IP); err != nil {
					t.Errorf("%s: SCTP reply: %v", be.name, err)
				}
			}
		}
	}
	if in == 0 || out == 0 {
		t.Fatal(errors.New("no SCTP seen on the backend nodes' uplinks"))
	}
	t.Logf("backend uplinks: %d SCTP packets in Geneve checked, %d SNAT'ed replies checked", in, out)
}
