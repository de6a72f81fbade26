//go:build linux

package lbxdp

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/pktgen"
)

// vip4c has one service: SCTP on all ports.
var vip4c = netip.MustParseAddr("203.0.113.12")

// sctpValue is a well-formed value for a chunk of the given type, so that gopacket
// decodes what the programs forward.
func sctpValue(chunk uint8) []byte {
	switch chunk {
	case pktgen.SCTPInit, pktgen.SCTPInitAck:
		// Initiate tag, a_rwnd, streams, initial TSN.
		v := binary.BigEndian.AppendUint32(nil, 0x1234abcd)
		v = binary.BigEndian.AppendUint32(v, 65535)
		v = binary.BigEndian.AppendUint32(v, 1<<16|1)
		return binary.BigEndian.AppendUint32(v, 1)
	case pktgen.SCTPData:
		// TSN, stream, sequence, protocol identifier, then user data.
		return append(binary.BigEndian.AppendUint32(make([]byte, 0, 12), 7), append(make([]byte, 8), pktgen.Bytes(37)...)...)
	case pktgen.SCTPSack:
		// Cumulative TSN ack, a_rwnd, no gap or duplicate reports.
		return append(binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 7), 65535), 0, 0, 0, 0)
	case pktgen.SCTPHeartbeat:
		return []byte{0, 1, 0, 8, 1, 2, 3, 4} // heartbeat info parameter
	case pktgen.SCTPShutdown:
		return binary.BigEndian.AppendUint32(nil, 7) // cumulative TSN ack
	case pktgen.SCTPCookieEcho:
		return pktgen.Bytes(32)
	}
	return nil
}

// sctpPacket is a client's SCTP packet whose only chunk is of the given type.
func sctpPacket(src, dst netip.Addr, sport, dport uint16, chunk uint8) pktgen.Packet {
	return pktgen.Packet{Src: src, Dst: dst, SrcPort: sport, DstPort: dport, Proto: ProtoSCTP, VTag: 0x5c7b0001,
		Chunks: []pktgen.SCTPChunk{{Type: chunk, Value: sctpValue(chunk)}}}
}

// sctpEnv: an SCTP service on vip4:36412 with backends A (1) and B (2), the table
// on A only; a UDP service on the same address and port, on backend C (3).
func sctpEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t)
	e.addBackend(t, 1, "198.18.20.1", 36412, "198.18.10.1")
	e.addBackend(t, 2, "198.18.20.2", 36412, "198.18.10.2")
	e.addBackend(t, 3, "198.18.20.3", 36412, "198.18.10.3")
	e.addService(t, svcSetup{ServiceKey{vip4, 36412, ProtoSCTP}, Service{ID: 1}, []uint32{1}})
	e.addService(t, svcSetup{ServiceKey{vip4, 36412, ProtoUDP}, Service{ID: 2}, []uint32{3}})
	return e
}

// TestSCTPAssociation follows an association through its chunks: every packet stays
// on the backend its INIT got while the table moves to another, the entry's state
// and timeout follow the chunks, and an INIT after the association closed is
// balanced again.
func TestSCTPAssociation(t *testing.T) {
	e := sctpEnv(t)
	cfg := DefaultConfig()
	pkt := func(chunk uint8) pktgen.Packet { return sctpPacket(client4, vip4, 40000, 36412, chunk) }
	if got := e.sendTo(t, pkt(pktgen.SCTPInit)); got != beA {
		t.Fatalf("INIT went to %v, want %v", got, beA)
	}
	e.setTable(t, 1, []uint32{2}, 31)
	steps := []struct {
		chunk   uint8
		state   CTState
		timeout time.Duration
	}{
		{pktgen.SCTPInit, CTSCTPInit, cfg.SCTPInitTimeout}, // a retransmitted INIT
		{pktgen.SCTPCookieEcho, CTSCTPCookie, cfg.SCTPInitTimeout},
		{pktgen.SCTPData, CTSCTPEstablished, cfg.SCTPEstablishedTimeout},
		{pktgen.SCTPSack, CTSCTPEstablished, cfg.SCTPEstablishedTimeout},
		{pktgen.SCTPHeartbeat, CTSCTPEstablished, cfg.SCTPEstablishedTimeout},
		{pktgen.SCTPInit, CTSCTPEstablished, cfg.SCTPEstablishedTimeout}, // a restart keeps the association's backend
		{pktgen.SCTPShutdown, CTSCTPShutdown, cfg.SCTPClosingTimeout},
		{pktgen.SCTPShutdownComplete, CTSCTPClosed, cfg.SCTPClosingTimeout},
	}
	for _, s := range steps {
		if got := e.sendTo(t, pkt(s.chunk)); got != beA {
			t.Fatalf("chunk %d went to %v, want %v (the association's backend)", s.chunk, got, beA)
		}
		ent := e.ct(t, pkt(s.chunk))
		if ent.State != s.state || ent.Tentative || ent.BackendID != 1 {
			t.Fatalf("after chunk %d: entry %+v, want state %v on backend 1, not tentative", s.chunk, ent, s.state)
		}
		if got := ent.ExpiresAt - ent.LastSeen; got != s.timeout+time.Second {
			t.Errorf("after chunk %d: lifetime %v, want the %v of state %v (+1s of rounding)", s.chunk, got, s.timeout, s.state)
		}
	}
	// ABORT closes too.
	abort := sctpPacket(client4, vip4, 40001, 36412, pktgen.SCTPAbort)
	e.sendTo(t, sctpPacket(client4, vip4, 40001, 36412, pktgen.SCTPInit))
	e.sendTo(t, abort)
	if st := e.ct(t, abort).State; st != CTSCTPClosed {
		t.Errorf("after ABORT: state %v", st)
	}
	// A new association on the closed tuple is balanced again, by today's table.
	if got := e.sendTo(t, pkt(pktgen.SCTPInit)); got != beB {
		t.Errorf("INIT after SHUTDOWN COMPLETE went to %v, want %v (the current table)", got, beB)
	}
	if ent := e.ct(t, pkt(pktgen.SCTPInit)); ent.State != CTSCTPInit || ent.BackendID != 2 {
		t.Errorf("new association's entry %+v", ent)
	}
}

// TestSCTPMidAssociation: an association first seen mid-way (another LB node had
// it) gets a tentative established entry that its next packet confirms.
func TestSCTPMidAssociation(t *testing.T) {
	e := sctpEnv(t)
	data := sctpPacket(client4, vip4, 40100, 36412, pktgen.SCTPData)
	e.sendTo(t, data)
	if ent := e.ct(t, data); ent.State != CTSCTPEstablished || !ent.Tentative {
		t.Fatalf("entry %+v, want tentative and established", ent)
	}
	e.sendTo(t, data)
	if ent := e.ct(t, data); ent.Tentative {
		t.Errorf("entry still tentative after a second packet: %+v", ent)
	}
}

// TestSCTPAndUDPApart: an SCTP and a UDP service on one address and port are two
// services: each protocol reaches its own backends, and a conntrack entry of one
// never serves the other.
func TestSCTPAndUDPApart(t *testing.T) {
	e := sctpEnv(t)
	udp := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 40200, DstPort: 36412, Proto: ProtoUDP, Payload: pktgen.Bytes(20)}
	sctp := sctpPacket(client4, vip4, 40200, 36412, pktgen.SCTPInit)
	for range 2 {
		if got := e.sendTo(t, sctp); got != beA {
			t.Errorf("SCTP went to %v, want %v", got, beA)
		}
		if got := e.sendTo(t, udp); got != netip.MustParseAddr("198.18.20.3") {
			t.Errorf("UDP went to %v, want the UDP service's backend", got)
		}
	}
	if ent := e.ct(t, sctp); ent.ServiceID != 1 {
		t.Errorf("SCTP entry on service %d", ent.ServiceID)
	}
	if ent := e.ct(t, udp); ent.ServiceID != 2 {
		t.Errorf("UDP entry on service %d", ent.ServiceID)
	}
	// Without the SCTP service, SCTP to the VIP has no service: dropped, not
	// handed to the UDP one.
	if err := e.d.DeleteService(ServiceKey{vip4, 36412, ProtoSCTP}); err != nil {
		t.Fatal(err)
	}
	e.expectDrop(t, sctpPacket(client4, vip4, 40201, 36412, pktgen.SCTPInit).Frame(), DropNoService)
}

// TestSCTPMalformed: SCTP to a VIP whose first chunk does not fit is dropped as
// malformed; the same to another address passes.
func TestSCTPMalformed(t *testing.T) {
	e := sctpEnv(t)
	noChunk := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 40300, DstPort: 36412, Proto: ProtoSCTP}
	long := sctpPacket(client4, vip4, 40301, 36412, pktgen.SCTPData)
	longIP := long.IP()
	binary.BigEndian.PutUint16(longIP[20+14:], 200) // the chunk claims more than the packet holds
	pktgen.SetSCTPChecksum(longIP[20:])
	e.expectDrop(t, noChunk.Frame(), DropMalformed)
	e.expectDrop(t, long.Wrap(longIP), DropMalformed)
	other := noChunk
	other.Dst = netip.MustParseAddr("198.51.100.1")
	if v, _ := e.run(t, other.Frame()); v != XDPPass {
		t.Errorf("malformed SCTP to a non-VIP: %v, want XDP_PASS", v)
	}
}
