//go:build linux

package lbxdp

import (
	"net/netip"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/pktgen"
)

// events returns the conntrack event counts by event.
func (e *env) events(t *testing.T) map[CTEvent]uint64 {
	t.Helper()
	evs, err := e.d.ConntrackEvents()
	if err != nil {
		t.Fatal(err)
	}
	out := map[CTEvent]uint64{}
	for _, ev := range evs {
		out[ev.Event] = ev.Count
	}
	return out
}

func (e *env) setGuard(t testing.TB, rate uint32) {
	t.Helper()
	cfg, err := e.d.Config()
	if err != nil {
		t.Fatal(err)
	}
	cfg.GuardRate = rate
	if err := e.d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
}

// TestFloodGuardSkipsInserts: past the guard's rate, new flows are still
// forwarded, to their Maglev backend, but get no entry; the guard's engagement
// and every skip are counted.
func TestFloodGuardSkipsInserts(t *testing.T) {
	e := ctEnv(t)
	e.setGuard(t, 1)
	const n = 40
	for i := range n {
		p := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: uint16(20000 + i), DstPort: 80}
		if got := e.sendTo(t, p); got != beA {
			t.Fatalf("flow %d went to %v, want its Maglev backend %v", i, got, beA)
		}
	}
	ev := e.events(t)
	// One admitted flow per second and CPU: the test's packets may straddle a
	// second and run on either of the machine's CPUs.
	if ev[CTInserted] > 4 || ev[CTGuardSkipped] < n-4 || ev[CTInserted]+ev[CTGuardSkipped] != n {
		t.Errorf("inserted %d, skipped %d of %d new flows at 1/s", ev[CTInserted], ev[CTGuardSkipped], n)
	}
	if ev[CTGuardEngaged] < 1 || ev[CTGuardEngaged] > 4 {
		t.Errorf("guard engaged %d times, want once per CPU and second", ev[CTGuardEngaged])
	}
	tracked := 0
	if err := e.d.Conntrack(func(CTEntry) bool { tracked++; return true }); err != nil {
		t.Fatal(err)
	}
	if uint64(tracked) != ev[CTInserted] {
		t.Errorf("%d entries, %d inserts counted", tracked, ev[CTInserted])
	}

	// The guard leaves existing flows alone: a tracked flow keeps its backend
	// when the table changes, while the guard is still engaged.
	var kept pktgen.Packet
	if err := e.d.Conntrack(func(c CTEntry) bool {
		kept = pktgen.Packet{Src: client4, Dst: vip4, SrcPort: c.Flow.Src.Port(), DstPort: 80, Flags: pktgen.ACK}
		return false
	}); err != nil {
		t.Fatal(err)
	}
	e.setTable(t, 1, []uint32{2}, 31)
	if got := e.sendTo(t, kept); got != beA {
		t.Errorf("tracked flow moved to %v under the guard", got)
	}
}

// TestFullTableFailsInsertsNotFlows: with every entry taken, a new flow is
// forwarded untracked and counted; no existing entry is evicted.
func TestFullTableFailsInsertsNotFlows(t *testing.T) {
	e := newEnvWith(t, Options{ConntrackSize: 1024, MaxBackends: 64, MaxServices: 16})
	e.addBackend(t, 1, "198.18.20.1", 8080, "198.18.10.1")
	e.addService(t, svcSetup{ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1}, []uint32{1}})
	e.setGuard(t, 0)
	size := int(ConntrackEntries(1024))
	fill := make([]CTEntry, size)
	now := MonotonicNow()
	for i := range fill {
		fill[i] = CTEntry{Flow: Flow{Src: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), 1000), Dst: netip.AddrPortFrom(vip4, 80), Proto: ProtoTCP},
			BackendID: 1, ServiceID: 1, State: CTEstablished, LastSeen: now}
	}
	if n, err := e.d.RestoreConntrack(fill); err != nil || n != size {
		t.Fatalf("filled %d of %d: %v", n, size, err)
	}
	p := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 30000, DstPort: 80}
	if got := e.sendTo(t, p); got != beA {
		t.Fatalf("new flow into a full table went to %v", got)
	}
	if ev := e.events(t); ev[CTInsertFailed] != 1 || ev[CTInserted] != 0 {
		t.Errorf("events %v, want one failed insert", ev)
	}
	for _, f := range fill[:10] {
		if _, ok, err := e.d.ConntrackLookup(f.Flow); !ok || err != nil {
			t.Fatalf("entry %v gone after a failed insert (%v)", f.Flow, err)
		}
	}
}

// TestSweepReclaimsOnlyUnestablished: over capacity, the collector reclaims
// tentative, SYN-only and closing entries, the longest idle first, down to the
// capacity; established flows stay, however long idle.
func TestSweepReclaimsOnlyUnestablished(t *testing.T) {
	e := newEnvWith(t, Options{ConntrackSize: 1024, MaxBackends: 64, MaxServices: 16})
	now := MonotonicNow()
	var entries []CTEntry
	add := func(n int, net byte, state CTState, tentative bool, idle time.Duration) {
		for i := range n {
			entries = append(entries, CTEntry{
				Flow:      Flow{Src: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, net, byte(i >> 8), byte(i)}), 1000), Dst: netip.AddrPortFrom(vip4, 80), Proto: ProtoTCP},
				BackendID: 1, ServiceID: 1, State: state, Tentative: tentative, LastSeen: now - idle,
			})
		}
	}
	add(1000, 1, CTEstablished, false, 50*time.Minute) // idle, but established
	add(100, 2, CTSyn, false, 30*time.Second)          // half-open
	add(100, 3, CTEstablished, true, 5*time.Second)    // picked up mid-flow, unconfirmed
	add(80, 4, CTClosing, false, 2*time.Second)
	if _, err := e.d.RestoreConntrack(entries); err != nil {
		t.Fatal(err)
	}
	sw, err := e.d.SweepConntrack(MonotonicNow())
	if err != nil {
		t.Fatal(err)
	}
	// 1,280 entries, 256 over: the 100 SYN-only (idle longest), then the 100
	// tentative, then the 80 closing (all idle 2 s: one bucket, taken whole).
	if sw.Scanned != 1280 || sw.Deleted != 280 || sw.Reclaimed != 280 {
		t.Errorf("sweep %+v; want 1280 scanned, 280 deleted, all reclaimed", sw)
	}
	if want := 1000.0 / 1280; sw.Fill != want {
		t.Errorf("fill %v, want %v", sw.Fill, want)
	}
	left := map[byte]int{}
	if err := e.d.Conntrack(func(c CTEntry) bool { left[c.Flow.Src.Addr().As4()[1]]++; return true }); err != nil {
		t.Fatal(err)
	}
	if left[1] != 1000 || left[2]+left[3]+left[4] != 0 {
		t.Errorf("left by kind %v, want only the 1000 established", left)
	}
	if ev := e.events(t); ev[CTReclaimed] != 280 {
		t.Errorf("reclaimed counted %d, want 280", ev[CTReclaimed])
	}

	// Over capacity with established flows only: nothing is cut short.
	add(250, 5, CTEstablished, false, time.Hour)
	if _, err := e.d.RestoreConntrack(entries[len(entries)-250:]); err != nil {
		t.Fatal(err)
	}
	if sw, err := e.d.SweepConntrack(MonotonicNow()); err != nil || sw.Deleted != 0 || sw.Fill != 1250.0/1280 {
		t.Errorf("established only: %+v (%v), want nothing deleted", sw, err)
	}
}
