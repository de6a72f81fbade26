//go:build linux

package lbxdp

import (
	"net/netip"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/pktgen"
)

// ctEnv: one TCP and one UDP service with backends A (1) and B (2); the table
// initially points at A only.
func ctEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t)
	e.addBackend(t, 1, "198.18.20.1", 8080, "198.18.10.1")
	e.addBackend(t, 2, "198.18.20.2", 8080, "198.18.10.2")
	e.addService(t, svcSetup{ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1}, []uint32{1}})
	e.addService(t, svcSetup{ServiceKey{vip4, 53, ProtoUDP}, Service{ID: 2}, []uint32{1}})
	e.addService(t, svcSetup{ServiceKey{vip6, 80, ProtoTCP}, Service{ID: 3}, nil})
	e.addBackend(t, 3, "2001:db8:20::3", 8080, "2001:db8:10::3")
	e.addBackend(t, 4, "2001:db8:20::4", 8080, "2001:db8:10::4")
	e.setTable(t, 3, []uint32{3}, 31)
	return e
}

// sendTo runs a packet and returns the backend address it was sent to.
func (e *env) sendTo(t *testing.T, p pktgen.Packet) netip.Addr {
	t.Helper()
	v, out := e.run(t, p.Frame())
	if v != XDPTx {
		t.Fatalf("verdict %v, want XDP_TX", v)
	}
	return backendOf(t, out)
}

// flowOf is the conntrack flow of a client packet.
func flowOf(p pktgen.Packet) Flow {
	proto := p.Proto
	if proto == 0 {
		proto = ProtoTCP
	}
	return Flow{Src: netip.AddrPortFrom(p.Src, p.SrcPort), Dst: netip.AddrPortFrom(p.Dst, p.DstPort), Proto: proto}
}

func (e *env) ct(t *testing.T, p pktgen.Packet) CTEntry {
	t.Helper()
	ent, ok, err := e.d.ConntrackLookup(flowOf(p))
	if err != nil || !ok {
		t.Fatalf("conntrack entry for %+v: ok=%v err=%v", flowOf(p), ok, err)
	}
	return ent
}

var (
	beA  = netip.MustParseAddr("198.18.20.1")
	beB  = netip.MustParseAddr("198.18.20.2")
	be6A = netip.MustParseAddr("2001:db8:20::3")
	be6B = netip.MustParseAddr("2001:db8:20::4")
)

// TestConntrackSticky: established flows keep their backend when the table
// changes; new flows follow the new table; both families.
func TestConntrackSticky(t *testing.T) {
	e := ctEnv(t)
	cases := []struct {
		name         string
		syn, newFlow pktgen.Packet
		svc          uint32
		a, b         netip.Addr
		bID          uint32
	}{
		{"tcp4", pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1000, DstPort: 80}, pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1001, DstPort: 80}, 1, beA, beB, 2},
		{"udp4", pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1000, DstPort: 53, Proto: ProtoUDP}, pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1001, DstPort: 53, Proto: ProtoUDP}, 2, beA, beB, 2},
		{"tcp6", pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 1000, DstPort: 80}, pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 1001, DstPort: 80}, 3, be6A, be6B, 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := e.sendTo(t, c.syn); got != c.a {
				t.Fatalf("first packet went to %v, want %v", got, c.a)
			}
			e.setTable(t, c.svc, []uint32{c.bID}, 13)
			if got := e.sendTo(t, ackOf(c.syn)); got != c.a {
				t.Errorf("established flow moved to %v after a table change", got)
			}
			if got := e.sendTo(t, c.newFlow); got != c.b {
				t.Errorf("new flow went to %v, want %v (new table)", got, c.b)
			}
		})
	}
}

// TestConntrackBackendGone: a flow whose backend was deleted is balanced again
// and its entry follows.
func TestConntrackBackendGone(t *testing.T) {
	e := ctEnv(t)
	syn := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 2000, DstPort: 80}
	if got := e.sendTo(t, syn); got != beA {
		t.Fatalf("went to %v", got)
	}
	e.setTable(t, 1, []uint32{2}, 31)
	if err := e.d.DeleteBackend(1); err != nil {
		t.Fatal(err)
	}
	if got := e.sendTo(t, ackOf(syn)); got != beB {
		t.Fatalf("flow of a deleted backend went to %v, want %v", got, beB)
	}
	if ent := e.ct(t, syn); ent.BackendID != 2 {
		t.Errorf("conntrack entry still points to backend %d", ent.BackendID)
	}
}

// TestConntrackStates: SYN, ACK, FIN and RST shape the entry's state and
// lifetime; a new SYN on a closing entry is balanced again.
func TestConntrackStates(t *testing.T) {
	e := ctEnv(t)
	cfg := DefaultConfig()
	base := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 3000, DstPort: 80}
	with := func(flags pktgen.TCPFlags) pktgen.Packet { p := base; p.Flags = flags; return p }
	steps := []struct {
		name    string
		flags   pktgen.TCPFlags
		state   CTState
		timeout time.Duration
	}{
		{"syn", pktgen.SYN, CTSyn, cfg.TCPSynTimeout},
		{"syn retransmit", pktgen.SYN, CTSyn, cfg.TCPSynTimeout},
		{"ack", pktgen.ACK, CTEstablished, cfg.TCPEstablishedTimeout},
		{"data", pktgen.ACK | pktgen.PSH, CTEstablished, cfg.TCPEstablishedTimeout},
		{"fin", pktgen.FIN | pktgen.ACK, CTClosing, cfg.TCPClosingTimeout},
		{"last ack", pktgen.ACK, CTClosing, cfg.TCPClosingTimeout},
	}
	for _, s := range steps {
		before := MonotonicNow()
		e.sendTo(t, with(s.flags))
		ent := e.ct(t, base)
		if ent.State != s.state {
			t.Fatalf("%s: state %v, want %v", s.name, ent.State, s.state)
		}
		// Times are whole seconds: the entry lives until the end of the second
		// its timeout ends in.
		if life := ent.ExpiresAt - ent.LastSeen; life != s.timeout+time.Second {
			t.Errorf("%s: lifetime %v, want %v + 1s", s.name, life, s.timeout)
		}
		if ent.LastSeen < before-2*time.Second || ent.LastSeen > MonotonicNow() || ent.Tentative {
			t.Errorf("%s: last seen %v around now %v, tentative %v", s.name, ent.LastSeen, before, ent.Tentative)
		}
		if ent.BackendID != 1 || ent.ServiceID != 1 {
			t.Errorf("%s: entry %+v", s.name, ent)
		}
	}
	// Port reuse: a new SYN on a closing entry is a new connection.
	e.setTable(t, 1, []uint32{2}, 31)
	if got := e.sendTo(t, with(pktgen.SYN)); got != beB {
		t.Errorf("SYN on a closing entry went to %v, want re-balanced to %v", got, beB)
	}
	if ent := e.ct(t, base); ent.State != CTSyn || ent.BackendID != 2 {
		t.Errorf("re-balanced entry %+v", ent)
	}
	// RST closes too; a mid-flow packet without entry starts established, but
	// tentative until another packet confirms it.
	rst := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 3001, DstPort: 80, Flags: pktgen.RST}
	e.sendTo(t, rst)
	if ent := e.ct(t, rst); ent.State != CTClosing {
		t.Errorf("RST: state %v", ent.State)
	}
	mid := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 3002, DstPort: 80, Flags: pktgen.ACK}
	udp := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 3003, DstPort: 53, Proto: ProtoUDP}
	for _, c := range []struct {
		name    string
		p       pktgen.Packet
		state   CTState
		timeout time.Duration
	}{{"mid-flow pickup", mid, CTEstablished, cfg.TCPEstablishedTimeout}, {"UDP", udp, CTOther, cfg.UDPTimeout}} {
		e.sendTo(t, c.p)
		if ent := e.ct(t, c.p); ent.State != c.state || !ent.Tentative || ent.ExpiresAt-ent.LastSeen != cfg.TentativeTimeout+time.Second {
			t.Errorf("%s: first packet's entry %+v, want %v, tentative for %v", c.name, ent, c.state, cfg.TentativeTimeout)
		}
		e.sendTo(t, c.p)
		if ent := e.ct(t, c.p); ent.State != c.state || ent.Tentative || ent.ExpiresAt-ent.LastSeen != c.timeout+time.Second {
			t.Errorf("%s: confirmed entry %+v, want %v for %v", c.name, ent, c.state, c.timeout)
		}
	}
}

// TestConntrackExpiry: an entry past its lifetime no longer pins the flow.
func TestConntrackExpiry(t *testing.T) {
	e := ctEnv(t)
	udp := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 4000, DstPort: 53, Proto: ProtoUDP}
	if got := e.sendTo(t, udp); got != beA {
		t.Fatalf("went to %v", got)
	}
	// The flow was last seen just over its timeout ago.
	ent := e.ct(t, udp)
	ent.Tentative = false
	ent.LastSeen = MonotonicNow() - DefaultConfig().UDPTimeout - 2*time.Second
	if _, err := e.d.RestoreConntrack([]CTEntry{ent}); err != nil {
		t.Fatal(err)
	}
	e.setTable(t, 2, []uint32{2}, 31)
	if got := e.sendTo(t, udp); got != beB {
		t.Errorf("expired entry still pinned the flow to %v", got)
	}
	// The packet replaced the expired entry with a new one.
	if ent := e.ct(t, udp); ent.BackendID != 2 || !ent.Tentative || ent.Expired(MonotonicNow()) {
		t.Errorf("entry after re-balancing %+v", ent)
	}
}

// TestConntrackListDelete: listing sees every entry, deletion by backend and
// by flow removes exactly what it should.
func TestConntrackListDelete(t *testing.T) {
	e := ctEnv(t)
	for i := range 50 {
		e.sendTo(t, pktgen.Packet{Src: client4, Dst: vip4, SrcPort: uint16(5000 + i), DstPort: 80})
	}
	e.setTable(t, 1, []uint32{2}, 31)
	for i := range 30 {
		e.sendTo(t, pktgen.Packet{Src: client4, Dst: vip4, SrcPort: uint16(6000 + i), DstPort: 80})
	}
	count := map[uint32]int{}
	if err := e.d.Conntrack(func(c CTEntry) bool { count[c.BackendID]++; return true }); err != nil {
		t.Fatal(err)
	}
	if count[1] != 50 || count[2] != 30 {
		t.Fatalf("listing: %v, want 50 on 1 and 30 on 2", count)
	}
	n, err := e.d.DeleteConntrackByBackend(1)
	if err != nil || n != 50 {
		t.Fatalf("delete by backend: %d, %v", n, err)
	}
	flows := []Flow{flowOf(pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 6000, DstPort: 80}), flowOf(pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 9999, DstPort: 80})}
	if n, err := e.d.DeleteConntrack(flows); err != nil || n != 1 {
		t.Fatalf("delete by flow: %d, %v (one of two exists)", n, err)
	}
	total := 0
	if err := e.d.Conntrack(func(c CTEntry) bool { total++; return c.BackendID == 2 }); err != nil {
		t.Fatal(err)
	}
	if total != 29 {
		t.Errorf("%d entries left, want 29", total)
	}
}

// TestSweepKeepsRefreshedEntries: an entry that expired when the collector read it, but
// that a packet wrote again before the collector deleted it, is kept.
func TestSweepKeepsRefreshedEntries(t *testing.T) {
	e := newEnv(t)
	now := MonotonicNow()
	entry := func(port uint16, lastSeen time.Duration) CTEntry {
		return CTEntry{Flow: Flow{Src: netip.AddrPortFrom(client4, port), Dst: netip.AddrPortFrom(vip4, 80), Proto: ProtoTCP},
			BackendID: 1, ServiceID: 1, State: CTEstablished, LastSeen: lastSeen}
	}
	idle := DefaultConfig().TCPEstablishedTimeout + time.Minute
	stale, fresh := entry(1001, now-idle), entry(1002, now-idle)
	if _, err := e.d.RestoreConntrack([]CTEntry{stale, fresh}); err != nil {
		t.Fatal(err)
	}
	var ks ctKeys
	for _, f := range []Flow{stale.Flow, fresh.Flow} {
		if err := ks.add(f); err != nil {
			t.Fatal(err)
		}
	}
	// A packet of the second flow comes after the read: a new entry, far from expiry.
	if _, err := e.d.DeleteConntrackWhere(func(c CTEntry) bool { return c.Flow == fresh.Flow }); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.RestoreConntrack([]CTEntry{entry(1002, now)}); err != nil {
		t.Fatal(err)
	}
	tm, err := e.d.timeouts()
	if err != nil {
		t.Fatal(err)
	}
	n, err := deleteMatching(e.d.objs.LbCt4, ks.v4, func(v *lbxdpLbCt) bool { return tm.expired(v, now) })
	if err != nil || n != 1 {
		t.Fatalf("deleted %d (%v), want 1", n, err)
	}
	if _, ok, _ := e.d.ConntrackLookup(fresh.Flow); !ok {
		t.Error("the entry written again after the read was deleted")
	}
	if _, ok, _ := e.d.ConntrackLookup(stale.Flow); ok {
		t.Error("the still-expired entry was kept")
	}
}
