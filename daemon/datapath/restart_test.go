//go:build linux

package datapath

import (
	"context"
	"github.com/lbd-dev/lbd/daemon/model/modeltest"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/lbd-dev/lbd/bpf/lbxdp"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// restartServices is a mix: derived sizes, set sizes, draining backends, a service
// without a usable backend, affinity and source ranges.
func restartServices() []*lbdv1.Service {
	svcs := manyServices(120, 10, 0)
	for i, s := range svcs {
		switch i % 6 {
		case 1:
			s.MaglevTableSize = 65537
		case 2:
			s.Backends[3].State = lbdv1.BackendState_BACKEND_STATE_DRAINING
			s.Backends[4].Weight = 3
		case 3:
			s.SessionAffinity = &lbdv1.SessionAffinity{Timeout: durationpb.New(time.Hour)}
			s.SourceRanges = []string{"10.0.0.0/8"}
		case 4:
			for _, b := range s.Backends {
				b.State = lbdv1.BackendState_BACKEND_STATE_DISABLED
			}
		case 5:
			s.Backends = s.Backends[:3]
		}
	}
	return svcs
}

// tableMaps returns the ID of each service's table map.
func tableMaps(tb testing.TB, m *Manager, svcs []*lbdv1.Service) map[uint32]ebpf.MapID {
	tb.Helper()
	out := map[uint32]ebpf.MapID{}
	for _, s := range svcs {
		st, err := m.lb.ReadTable(s.Id)
		if err != nil {
			tb.Fatal(err)
		}
		if st != nil {
			out[s.Id] = st.MapID
		}
	}
	return out
}

// TestRestartWritesNothing: a daemon restarted on the same pins and state checks the
// tables it finds against the desired state by their digests and writes nothing, not
// even at Open; a table whose slots were changed behind its back is found and
// rewritten; a weight change rewrites that service's table only, in its map.
func TestRestartWritesNothing(t *testing.T) {
	ctx := context.Background()
	n := newNode(t)
	svcs := restartServices()
	m := n.open(t, n.config(1<<16))
	first, err := m.Sync(ctx, modeltest.All(svcs...))
	if err != nil {
		t.Fatal(err)
	}
	if m.MapWrites() == 0 {
		t.Fatal("the first sync counted no write")
	}
	ids := tableMaps(t, m, svcs)
	if len(ids) != 100 { // the 20 services without a usable backend have none
		t.Fatalf("%d tables, want 100", len(ids))
	}
	want := map[uint32][]uint32{}
	for id := range ids {
		want[id], _ = m.lb.MaglevTable(id)
	}
	m.Close()

	m = n.open(t, n.config(1<<16))
	if w := m.MapWrites(); w != 0 {
		t.Fatalf("opening the adopted datapath wrote %d entries", w)
	}
	again, err := m.Sync(ctx, modeltest.All(svcs...))
	if err != nil {
		t.Fatal(err)
	}
	if w := m.MapWrites(); w != 0 {
		t.Fatalf("the sync after a restart wrote %d entries, want none", w)
	}
	for name, s := range first {
		if !maps.Equal(again[name], s) {
			t.Errorf("service %s: shares %v after the restart, %v before", name, again[name], s)
		}
	}
	if got := tableMaps(t, m, svcs); !maps.Equal(got, ids) {
		t.Error("table maps were replaced")
	}
	if drift, err := m.Verify(ctx); err != nil || len(drift) != 0 {
		t.Fatalf("verify after the restart: %v %v", drift, err)
	}

	// A slot rewritten by something else: the next start finds it and rewrites the
	// table (in a new map), and nothing else.
	var victim uint32 = 1
	tamper(t, m, victim)
	if st, _ := m.lb.ReadTable(victim); st == nil || st.Intact {
		t.Fatal("the tampered table reads as intact")
	}
	m.Close()
	m = n.open(t, n.config(1<<16))
	if _, err := m.Sync(ctx, modeltest.All(svcs...)); err != nil {
		t.Fatal(err)
	}
	if w, max := m.MapWrites(), uint64(lbxdp.TableElems(2039, 10))+1; w == 0 || w > max {
		t.Errorf("rewriting one table wrote %d entries, want 1 to %d", w, max)
	}
	if got, _ := m.lb.MaglevTable(victim); !slices.Equal(got, want[victim]) {
		t.Error("the tampered table was not restored")
	}
	ids2 := tableMaps(t, m, svcs)
	for id, mid := range ids {
		if id != victim && ids2[id] != mid {
			t.Errorf("the table of service %d was replaced", id)
		}
	}

	// A weight change: that table changes in place, the others stay.
	changed := proto.Clone(svcs[6]).(*lbdv1.Service)
	changed.Backends[0].Weight = 2
	before := m.MapWrites()
	if _, err := m.Upsert(ctx, modeltest.Of(changed)); err != nil {
		t.Fatal(err)
	}
	w := m.MapWrites() - before
	if w == 0 || w > uint64(lbxdp.TableElems(2039, 10)) {
		t.Errorf("a weight change wrote %d entries", w)
	}
	if got := tableMaps(t, m, svcs); !maps.Equal(got, ids2) {
		t.Error("a weight change replaced a table map")
	}
	if got, _ := m.lb.MaglevTable(changed.Id); slices.Equal(got, want[changed.Id]) {
		t.Error("a weight change left the table as it was")
	}
}

// tamper changes one slot of the active half of a service's table, as something other
// than lbd writing the map would.
func tamper(tb testing.TB, m *Manager, serviceID uint32) {
	tb.Helper()
	var id ebpf.MapID
	if err := m.lb.StateMaps()[lbxdp.MapTables].Lookup(serviceID, &id); err != nil {
		tb.Fatal(err)
	}
	inner, err := ebpf.NewMapFromID(id)
	if err != nil {
		tb.Fatal(err)
	}
	defer inner.Close()
	var head, elem [16]uint32
	if err := inner.Lookup(uint32(0), &head); err != nil {
		tb.Fatal(err)
	}
	// The first slot element of the active half (lbstate.h): 1 + I, or + S for half 1.
	m0 := head[0] &^ (1 << 31)
	k := 1 + head[1]
	if head[0]>>31 == 1 {
		k += (m0 + 31) / 32
	}
	if err := inner.Lookup(k, &elem); err != nil {
		tb.Fatal(err)
	}
	elem[0] ^= 1 // slot 0 now refers to another index
	if err := inner.Update(k, &elem, ebpf.UpdateExist); err != nil {
		tb.Fatal(err)
	}
}
