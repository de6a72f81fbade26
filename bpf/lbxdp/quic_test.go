//go:build linux

package lbxdp

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/lbd-dev/lbd/internal/pktgen"
)

// QUIC-LB plaintext IDs of the test: config rotation 1, 2-byte server IDs.
var (
	quicCfg  = QUIC{ConfigID: 1, ServerIDLen: 2}
	sidA     = []byte{0x0a, 0x01}
	sidB     = []byte{0x0b, 0x02}
	sidC     = []byte{0x0c, 0x03}
	beC      = netip.MustParseAddr("198.18.20.3")
	quicPort = uint16(443)
)

// quicCID is a connection ID of the plaintext form: the first octet (config rotation
// cr in its top bits, then bits the server uses), the server ID, a nonce.
func quicCID(cr uint8, sid []byte) []byte {
	return append(append([]byte{cr<<5 | 0x07}, sid...), 0xde, 0xad, 0xbe, 0xef, 0x42)
}

// quicShort is a 1-RTT packet to dcid: header, packet number, protected payload.
func quicShort(dcid []byte) []byte {
	return append(append([]byte{0x40 | 0x01}, dcid...), append([]byte{0x12, 0x34}, pktgen.Bytes(40)...)...)
}

// quicLong is a long-header packet of the version and type bits to dcid.
func quicLong(version uint32, typ uint8, dcid []byte) []byte {
	b := binary.BigEndian.AppendUint32([]byte{0xc0 | typ<<4}, version)
	b = append(append(b, byte(len(dcid))), dcid...)
	b = append(b, 8, 1, 2, 3, 4, 5, 6, 7, 8) // source ID
	return append(b, pktgen.Bytes(1200)...)
}

// quicEnv: a QUIC-aware UDP service on vip4:443 (ID 1) with backends A, B and C whose
// server IDs are sidA, sidB and sidC, the Maglev table on A only (B and C drained, so
// only their IDs bring packets to them); a plain UDP service on vip4:444 (ID 2) on A.
func quicEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t)
	for i, a := range []string{"198.18.20.1", "198.18.20.2", "198.18.20.3"} {
		e.addBackend(t, uint32(i+1), a, quicPort, "198.18.10."+a[len(a)-1:])
	}
	e.addService(t, svcSetup{ServiceKey{vip4, quicPort, ProtoUDP}, Service{ID: 1, QUIC: quicCfg}, []uint32{1}})
	e.addService(t, svcSetup{ServiceKey{vip4, 444, ProtoUDP}, Service{ID: 2}, []uint32{1}})
	for i, sid := range [][]byte{sidA, sidB, sidC} {
		if err := e.d.SetQUICServerID(1, sid, uint32(i+1)); err != nil {
			t.Fatal(err)
		}
		if err := e.d.SetQUICServerID(2, sid, uint32(i+1)); err != nil { // ignored: service 2 is not QUIC-aware
			t.Fatal(err)
		}
	}
	return e
}

func quicPacket(sport, dport uint16, payload []byte) pktgen.Packet {
	return pktgen.Packet{Src: client4, Dst: vip4, SrcPort: sport, DstPort: dport, Proto: ProtoUDP, Payload: payload}
}

// quicRoutes reads the QUIC counters by route.
func (e *env) quicRoutes(t *testing.T) map[QUICRoute]uint64 {
	t.Helper()
	rs, err := e.d.QUICRoutes()
	if err != nil {
		t.Fatal(err)
	}
	out := map[QUICRoute]uint64{}
	for _, r := range rs {
		out[r.Route] = r.Count
	}
	return out
}

// TestQUICRouting: which backend each kind of QUIC packet reaches, how it is counted,
// and what a trace of it reports.
func TestQUICRouting(t *testing.T) {
	e := quicEnv(t)
	cases := []struct {
		name    string
		payload []byte
		dport   uint16
		want    netip.Addr
		route   QUICRoute
	}{
		{"short header names B", quicShort(quicCID(1, sidB)), quicPort, beB, QUICRouted},
		{"short header names C", quicShort(quicCID(1, sidC)), quicPort, beC, QUICRouted},
		{"v1 handshake names B", quicLong(1, 2, quicCID(1, sidB)), quicPort, beB, QUICRouted},
		{"v2 handshake names C", quicLong(0x6b3343cf, 3, quicCID(1, sidC)), quicPort, beC, QUICRouted},
		{"v1 initial: the client's ID", quicLong(1, 0, quicCID(1, sidB)), quicPort, beA, QUICClientCID},
		{"v1 0-rtt: the client's ID", quicLong(1, 1, quicCID(1, sidB)), quicPort, beA, QUICClientCID},
		{"v2 initial: the client's ID", quicLong(0x6b3343cf, 1, quicCID(1, sidC)), quicPort, beA, QUICClientCID},
		{"unknown version: a client's first flight", quicLong(0xff00001d, 2, quicCID(1, sidB)), quicPort, beA, QUICClientCID},
		{"another config rotation", quicShort(quicCID(2, sidB)), quicPort, beA, QUICUnknownID},
		{"unroutable config rotation", quicShort(quicCID(7, sidB)), quicPort, beA, QUICUnknownID},
		{"server ID of no backend", quicShort(quicCID(1, []byte{0x0d, 0x04})), quicPort, beA, QUICUnknownID},
		{"short datagram names B", []byte{0x41, 1<<5 | 7, 0x0b, 0x02, 1, 2, 3, 4, 5, 6, 7, 8}, quicPort, beB, QUICRouted},
		{"datagram too short for a server ID", []byte{0x41, 1<<5 | 7, 0x0b}, quicPort, beA, QUICMalformed},
		{"long header ID shorter than a server ID", quicLong(1, 2, []byte{1 << 5, 0x0b}), quicPort, beA, QUICMalformed},
		{"retry from a client", quicLong(1, 3, quicCID(1, sidB)), quicPort, beA, QUICMalformed},
		{"version negotiation from a client", quicLong(0, 2, quicCID(1, sidB)), quicPort, beA, QUICMalformed},
		{"service without QUIC routing", quicShort(quicCID(1, sidB)), 444, beA, QUICNone},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := quicPacket(uint16(30000+i), c.dport, c.payload)
			tr, err := e.d.TraceResult(p.Frame(), e.ifA)
			if err != nil {
				t.Fatal(err)
			}
			if tr.QUIC != c.route {
				t.Errorf("trace reports route %v, want %v", tr.QUIC, c.route)
			}
			before := e.quicRoutes(t)
			if got := e.sendTo(t, p); got != c.want {
				t.Errorf("went to %v, want %v", got, c.want)
			}
			after := e.quicRoutes(t)
			for r := QUICRouted; r < quicRoutes; r++ {
				want := uint64(0)
				if r == c.route {
					want = 1
				}
				if after[r]-before[r] != want {
					t.Errorf("counter %v moved by %d, want %d", r, after[r]-before[r], want)
				}
			}
			_, tracked, err := e.d.ConntrackLookup(flowOf(p))
			if err != nil {
				t.Fatal(err)
			}
			if tracked != (c.route != QUICRouted) {
				t.Errorf("conntrack entry %v: a packet routed by its ID needs none, the others get one", tracked)
			}
		})
	}
}

// TestQUICRebindingAndBackendChanges: a connection's packets follow its server ID
// whatever their source port; a removed backend's ID, or one no longer set, falls back
// to the 5-tuple; an ID restored routes again.
func TestQUICRebindingAndBackendChanges(t *testing.T) {
	e := quicEnv(t)
	short := quicShort(quicCID(1, sidB))
	for port := uint16(40000); port < 40032; port++ {
		if got := e.sendTo(t, quicPacket(port, quicPort, short)); got != beB {
			t.Fatalf("from port %d: went to %v, want %v (its server ID)", port, got, beB)
		}
	}
	// A new table (a backend added) changes nothing for routed connections.
	e.setTable(t, 1, []uint32{1, 3}, 31)
	if got := e.sendTo(t, quicPacket(41000, quicPort, short)); got != beB {
		t.Errorf("after a table change: went to %v, want %v", got, beB)
	}
	if err := e.d.DeleteBackend(2); err != nil {
		t.Fatal(err)
	}
	p := quicPacket(41001, quicPort, short)
	if got := e.sendTo(t, p); got == beB {
		t.Errorf("the ID of a removed backend still routes to it")
	}
	if tr, err := e.d.TraceResult(p.Frame(), e.ifA); err != nil || tr.QUIC != QUICUnknownID {
		t.Errorf("trace of a removed backend's ID: %v, %v; want %v", tr.QUIC, err, QUICUnknownID)
	}
	if err := e.d.DeleteQUICServerID(1, sidC); err != nil {
		t.Fatal(err)
	}
	if tr, err := e.d.TraceResult(quicPacket(41002, quicPort, quicShort(quicCID(1, sidC))).Frame(), e.ifA); err != nil || tr.QUIC != QUICUnknownID {
		t.Errorf("trace of a deleted ID: %v, %v; want %v", tr.QUIC, err, QUICUnknownID)
	}
	if err := e.d.SetQUICServerID(1, sidC, 3); err != nil {
		t.Fatal(err)
	}
	if got := e.sendTo(t, quicPacket(41003, quicPort, quicShort(quicCID(1, sidC)))); got != beC {
		t.Errorf("restored ID went to %v, want %v", got, beC)
	}
	ids, err := e.d.QUICServerIDs(map[uint32]uint8{1: 2, 2: 2})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids[1]; len(got) != 3 || got[string(sidA)] != 1 || got[string(sidC)] != 3 {
		t.Errorf("server IDs of service 1: %v", got)
	}
}

// TestQUICConfigChecked: QUIC settings outside QUIC-LB's ranges are refused.
func TestQUICConfigChecked(t *testing.T) {
	e := newEnv(t)
	for _, q := range []QUIC{{ConfigID: 7, ServerIDLen: 2}, {ConfigID: 0, ServerIDLen: 16}} {
		if err := e.d.UpsertService(ServiceKey{vip4, 443, ProtoUDP}, Service{ID: 1, QUIC: q}); err == nil {
			t.Errorf("QUIC %+v accepted", q)
		}
	}
	if err := e.d.SetQUICServerID(1, make([]byte, 16), 1); err == nil {
		t.Error("a 16-byte server ID accepted")
	}
}

// TestQUICRoutingIPv6: an IPv6 service's short headers and Handshakes go to the backend
// their server ID names; a server ID naming a backend of the other family falls back.
func TestQUICRoutingIPv6(t *testing.T) {
	e := newEnv(t)
	e.addBackend(t, 1, "198.18.20.1", quicPort, "198.18.10.1")
	e.addBackend(t, 3, "2001:db8:20::3", quicPort, "2001:db8:10::3")
	e.addBackend(t, 4, "2001:db8:20::4", quicPort, "2001:db8:10::4")
	e.addService(t, svcSetup{ServiceKey{vip6, quicPort, ProtoUDP}, Service{ID: 1, QUIC: quicCfg}, []uint32{3}})
	for sid, be := range map[string]uint32{string(sidA): 1, string(sidB): 4} {
		if err := e.d.SetQUICServerID(1, []byte(sid), be); err != nil {
			t.Fatal(err)
		}
	}
	packet := func(sport uint16, payload []byte) pktgen.Packet {
		return pktgen.Packet{Src: client6, Dst: vip6, SrcPort: sport, DstPort: quicPort, Proto: ProtoUDP, Payload: payload}
	}
	for _, c := range []struct {
		name    string
		payload []byte
		want    netip.Addr
		route   QUICRoute
	}{
		{"short header", quicShort(quicCID(1, sidB)), be6B, QUICRouted},
		{"handshake", quicLong(1, 2, quicCID(1, sidB)), be6B, QUICRouted},
		{"initial", quicLong(1, 0, quicCID(1, sidB)), be6A, QUICClientCID},
		{"an IPv4 backend's server ID", quicShort(quicCID(1, sidA)), be6A, QUICUnknownID},
	} {
		for sport := uint16(50000); sport < 50004; sport++ {
			p := packet(sport, c.payload)
			tr, err := e.d.TraceResult(p.Frame(), e.ifA)
			if err != nil {
				t.Fatal(err)
			}
			if got := e.sendTo(t, p); got != c.want || tr.QUIC != c.route {
				t.Errorf("%s from port %d: went to %v (route %v), want %v (%v)", c.name, sport, got, tr.QUIC, c.want, c.route)
			}
		}
	}
}
