//go:build linux

package datapath

import (
	"context"
	"fmt"
	"github.com/lbd-dev/lbd/daemon/model"
	"github.com/lbd-dev/lbd/daemon/model/modeltest"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/bpf/lbxdp"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

func ctEntries(n int, svc, firstBackend, backends uint32, expires time.Duration, srcNet byte) []lbxdp.CTEntry {
	now := lbxdp.MonotonicNow()
	out := make([]lbxdp.CTEntry, n)
	for i := range n {
		src := netip.AddrFrom4([4]byte{100, srcNet, byte(i >> 8), byte(i)})
		out[i] = lbxdp.CTEntry{
			Flow:      lbxdp.Flow{Src: netip.AddrPortFrom(src, uint16(1024+i%60000)), Dst: netip.MustParseAddrPort("203.0.113.10:80"), Proto: lbxdp.ProtoTCP},
			BackendID: firstBackend + uint32(i)%backends, ServiceID: svc, State: lbxdp.CTEstablished,
			LastSeen: now + expires - lbxdp.DefaultConfig().TCPEstablishedTimeout,
		}
	}
	return out
}

func dump(tb testing.TB, m *Manager) map[lbxdp.Flow]lbxdp.CTEntry {
	tb.Helper()
	out := map[lbxdp.Flow]lbxdp.CTEntry{}
	if err := m.lb.Conntrack(func(e lbxdp.CTEntry) bool { out[e.Flow] = e; return true }); err != nil {
		tb.Fatal(err)
	}
	return out
}

// TestRestartAdoptsStateAndGrowsConntrack closes the manager (as SIGTERM does) and opens
// a new one on the same pins with twice the conntrack size: every flow, service and
// table is still there, and the XDP link is adopted rather than re-attached.
func TestRestartAdoptsStateAndGrowsConntrack(t *testing.T) {
	n := newNode(t)
	m := n.open(t, n.config(1<<16))
	svc := service(1, "web", "203.0.113.10", 80, 251, backend(1, "198.18.10.1", 8080, active), backend(2, "198.18.10.2", 8080, active))
	if _, err := m.Sync(context.Background(), modeltest.All(svc)); err != nil {
		t.Fatal(err)
	}
	if w, err := m.lb.RestoreConntrack(ctEntries(50000, 1, 1, 2, time.Hour, 1)); err != nil || w != 50000 {
		t.Fatalf("restore: %d %v", w, err)
	}
	before := dump(t, m)
	table, _ := m.lb.MaglevTable(1)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}

	m2 := n.open(t, n.config(1<<17))
	if got := m2.lb.Options().ConntrackSize; got != 1<<17 {
		t.Fatalf("conntrack size %d after restart", got)
	}
	after := dump(t, m2)
	if len(after) != len(before) {
		t.Fatalf("%d conntrack entries before the restart, %d after", len(before), len(after))
	}
	for f, e := range before {
		if after[f] != e {
			t.Fatalf("entry %v changed: %+v → %+v", f, e, after[f])
		}
	}
	if got, _ := m2.lb.MaglevTable(1); m2.programmed[1] == nil || !slices.Equal(got, table) || m2.programmed[1].table.digest == 0 {
		t.Fatalf("service table not adopted")
	}
	if _, ok := m2.links["xdp-"+n.uplink]; !ok {
		t.Fatalf("XDP link not adopted: %v", m2.links)
	}
	if _, err := m2.Sync(context.Background(), modeltest.All(svc)); err != nil {
		t.Fatal(err)
	}
	if got := dump(t, m2); len(got) != len(before) {
		t.Fatalf("sync after restart dropped flows: %d of %d left", len(got), len(before))
	}
}

// TestDrainAndDisable: draining keeps a backend's flows and takes it out of the table;
// disabling also deletes its conntrack entries so its flows re-balance.
func TestDrainAndDisable(t *testing.T) {
	n := newNode(t)
	m := n.open(t, n.config(1<<16))
	mk := func(s2 lbdv1.BackendState) *lbdv1.Service {
		return service(1, "web", "203.0.113.10", 80, 251, backend(1, "198.18.10.1", 8080, active), backend(2, "198.18.10.2", 8080, s2))
	}
	ctx := context.Background()
	if _, err := m.Sync(ctx, modeltest.All(mk(active))); err != nil {
		t.Fatal(err)
	}
	if _, err := m.lb.RestoreConntrack(ctEntries(1000, 1, 1, 2, time.Hour, 2)); err != nil {
		t.Fatal(err)
	}
	count := func(bid uint32) int {
		c := 0
		for _, e := range dump(t, m) {
			if e.BackendID == bid {
				c++
			}
		}
		return c
	}
	slots, err := m.Upsert(ctx, modeltest.Of(mk(lbdv1.BackendState_BACKEND_STATE_DRAINING)))
	if err != nil {
		t.Fatal(err)
	}
	if slots[2] != 0 || slots[1] != 251 {
		t.Errorf("drained backend still in the table: %v", slots)
	}
	if count(2) != 500 {
		t.Errorf("draining removed flows: %d of 500 left", count(2))
	}
	if _, ok, _ := m.lb.Backend(2); !ok {
		t.Error("drained backend left the backend map: its flows would break")
	}
	if _, err := m.Upsert(ctx, modeltest.Of(mk(lbdv1.BackendState_BACKEND_STATE_DISABLED))); err != nil {
		t.Fatal(err)
	}
	if count(2) != 0 || count(1) != 500 {
		t.Errorf("after disable: backend 2 has %d flows (want 0), backend 1 has %d (want 500)", count(2), count(1))
	}
	if _, ok, _ := m.lb.Backend(2); ok {
		t.Error("disabled backend still in the backend map")
	}
}

// TestGCRemovesExactlyTheExpired loads 1M expired and 1M live entries; one pass removes
// exactly the expired ones.
func TestGCRemovesExactlyTheExpired(t *testing.T) {
	if testing.Short() {
		t.Skip("2M conntrack entries: skipped in -short mode")
	}
	n := newNode(t)
	m := n.open(t, n.config(1<<22))
	const each = 1 << 20
	if _, err := m.lb.RestoreConntrack(ctEntries(each, 0, 1, 10, -time.Minute, 3)); err != nil {
		t.Fatal(err)
	}
	// Another source network, so the live flows do not collide with the expired ones.
	live := ctEntries(each, 0, 1, 10, time.Hour, 4)
	for i := range live {
		live[i].Flow.Src = netip.AddrPortFrom(netip.AddrFrom4([4]byte{100, byte(64 + i>>16), byte(i >> 8), byte(i)}), live[i].Flow.Src.Port())
	}
	if _, err := m.lb.RestoreConntrack(live); err != nil {
		t.Fatal(err)
	}
	passes, err := m.SweepNow()
	if err != nil {
		t.Fatal(err)
	}
	p := passes[0]
	t.Logf("GC pass: scanned %d, deleted %d in %v", p.Scanned, p.Deleted, p.Duration)
	if p.Scanned != 2*each || p.Deleted != each {
		t.Fatalf("scanned %d deleted %d, want %d and %d", p.Scanned, p.Deleted, 2*each, each)
	}
	now := lbxdp.MonotonicNow()
	left := dump(t, m)
	if len(left) != each {
		t.Fatalf("%d entries left, want %d", len(left), each)
	}
	for _, e := range left {
		if e.Expired(now) {
			t.Fatalf("expired entry survived: %+v", e)
		}
	}
}

// TestTwoNodesChooseTheSameBackend: two LB nodes with the same services pick the same
// backend for 1,000 flows (the loaded programs are asked through TraceFlow).
func TestTwoNodesChooseTheSameBackend(t *testing.T) {
	var bes []*lbdv1.Backend
	for i := range 7 {
		bes = append(bes, backend(uint32(i+1), fmt.Sprintf("198.18.10.%d", i+1), 8080, active))
	}
	svc := service(1, "web", "203.0.113.10", 80, 16381, bes...)
	var ms []*Manager
	var nodes []*node
	for range 2 {
		n := newNode(t)
		m := n.open(t, n.config(1<<16))
		if _, err := m.Sync(context.Background(), modeltest.All(svc)); err != nil {
			t.Fatal(err)
		}
		ms, nodes = append(ms, m), append(nodes, n)
	}
	seen := map[string]int{}
	for i := range 1000 {
		req := model.Flow{Protocol: lbdv1.Protocol_PROTOCOL_TCP, Src: netip.AddrPortFrom(netip.AddrFrom4([4]byte{100, 64, byte(i / 250), byte(i%250 + 1)}), uint16(20000+i)),
			Dst: netip.MustParseAddrPort("203.0.113.10:80")}
		var got [2]string
		for j, m := range ms {
			var resp *lbdv1.TraceFlowResponse
			var err error
			// The FIB lookup resolves in the caller's namespace, the node's in lbd.
			nodes[j].ns.Do(t, func() { resp, err = m.TraceFlow(context.Background(), req) })
			if err != nil {
				t.Fatal(err)
			}
			if resp.Backend == nil {
				t.Fatalf("flow %d not forwarded on node %d: %s %s", i, j, resp.Verdict, resp.Reason)
			}
			got[j] = resp.Backend.Address
		}
		if got[0] != got[1] {
			t.Fatalf("flow %d: node 0 chose %s, node 1 chose %s", i, got[0], got[1])
		}
		seen[got[0]]++
	}
	if len(seen) != 7 {
		t.Errorf("1,000 flows reached %d of 7 backends: %v", len(seen), seen)
	}
}

// TestAffinityFollowsTheTable: draining a backend removes the affinity entries that
// point at it (new flows would otherwise follow affinity to it) and keeps the others;
// deleting the service removes all of its entries, so that a service that later gets
// its ID starts without them.
func TestAffinityFollowsTheTable(t *testing.T) {
	n := newNode(t)
	m := n.open(t, n.config(1<<16))
	mk := func(s2 lbdv1.BackendState) *lbdv1.Service {
		s := service(1, "web", "203.0.113.10", 80, 251, backend(1, "198.18.10.1", 8080, active), backend(2, "198.18.10.2", 8080, s2))
		s.SessionAffinity = &lbdv1.SessionAffinity{Timeout: durationpb.New(time.Hour)}
		return s
	}
	ctx := context.Background()
	if _, err := m.Sync(ctx, modeltest.All(mk(active))); err != nil {
		t.Fatal(err)
	}
	clients := map[uint32]netip.Addr{1: netip.MustParseAddr("198.51.100.1"), 2: netip.MustParseAddr("198.51.100.2")}
	for bid, c := range clients {
		if err := m.lb.SetAffinity(lbxdp.AffinityEntry{ServiceID: 1, Client: c, BackendID: bid, LastSeen: lbxdp.MonotonicNow()}); err != nil {
			t.Fatal(err)
		}
	}
	backends := func() map[uint32]bool {
		es, err := m.lb.Affinity()
		if err != nil {
			t.Fatal(err)
		}
		got := map[uint32]bool{}
		for _, e := range es {
			got[e.BackendID] = true
		}
		return got
	}
	if _, err := m.Upsert(ctx, modeltest.Of(mk(lbdv1.BackendState_BACKEND_STATE_DRAINING))); err != nil {
		t.Fatal(err)
	}
	if got := backends(); !got[1] || got[2] {
		t.Errorf("after draining backend 2, affinity entries point at backends %v, want only 1", got)
	}
	if err := m.Delete(ctx, modeltest.Of(mk(lbdv1.BackendState_BACKEND_STATE_DRAINING))); err != nil {
		t.Fatal(err)
	}
	if got := backends(); len(got) != 0 {
		t.Errorf("after deleting the service, affinity entries point at backends %v", got)
	}
}

// TestMemoryFigures: TableBytes is exactly what the kernel charges for a service's
// table map, for a size that is set and for derived ones, and MapBytes counts the maps
// the configuration sizes (the conntrack table alone is most of it) but not the tables.
func TestMemoryFigures(t *testing.T) {
	n := newNode(t)
	m := n.open(t, n.config(1<<16))
	before, err := m.MapBytes()
	if err != nil {
		t.Fatal(err)
	}
	if ct := uint64(1<<16) * 144; before < ct {
		t.Errorf("MapBytes %d, less than the conntrack table alone (%d)", before, ct)
	}
	backends := func(first, n uint32) []*lbdv1.Backend {
		var out []*lbdv1.Backend
		for i := range n {
			out = append(out, backend(first+i, fmt.Sprintf("198.18.10.%d", first+i), 8080, active))
		}
		return out
	}
	svcs := []*lbdv1.Service{
		service(1, "set", "203.0.113.10", 80, 65537, backends(1, 1)...),
		service(2, "ten", "203.0.113.11", 80, 0, backends(2, 10)...),
		service(3, "seventeen", "203.0.113.12", 80, 0, backends(12, 17)...),
	}
	svcs[2].Backends[16].State = lbdv1.BackendState_BACKEND_STATE_DRAINING // counted all the same
	if _, err := m.Sync(context.Background(), modeltest.All(svcs...)); err != nil {
		t.Fatal(err)
	}
	after, err := m.MapBytes()
	if err != nil || after != before {
		t.Errorf("MapBytes %d after tables were added, want %d unchanged (%v)", after, before, err)
	}
	for _, svc := range svcs {
		tm, err := m.lb.TableMapMemlock(svc.Id)
		if err != nil {
			t.Fatal(err)
		}
		if want := m.TableBytes(svc); tm != want {
			t.Errorf("the kernel charges %d for the table of service %s, TableBytes says %d", tm, svc.Name, want)
		}
		t.Logf("service %s: %d-slot table, %d bytes", svc.Name, m.programmed[svc.Id].table.size, tm)
	}
	t.Logf("maps sized by the configuration: %d bytes", before)
}
