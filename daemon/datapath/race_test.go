//go:build linux

package datapath

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/bpf/lbxdp"
	"github.com/lbd-dev/lbd/daemon/reconcile"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// churn is one goroutine's share of TestIDReuseRacesTheReconciler: it deletes and
// creates services, and removes and adds backends of a service it keeps, so that IDs
// are freed and asked for again while the reconciler still applies earlier changes.
func churn(t *testing.T, st *store.Store, g, rounds int) {
	keep := fmt.Sprintf("keep-%d", g)
	vip := func(i int) string { return fmt.Sprintf("203.0.113.%d", 1+(g*64+i%60)%250) }
	svc := func(name string, port, i int) *lbdv1.Service {
		s := &lbdv1.Service{Name: name, Vip: vip(i), Port: uint32(port), Protocol: lbdv1.Protocol_PROTOCOL_TCP, MaglevTableSize: 251}
		for b := range 3 {
			s.Backends = append(s.Backends, &lbdv1.Backend{Address: fmt.Sprintf("198.18.%d.%d", 10+g, 1+(i*3+b)%250), Port: 8080})
		}
		return s
	}
	if _, err := st.CreateService(svc(keep, 1000+g, 0)); err != nil {
		t.Error(err)
		return
	}
	for i := range rounds {
		name := fmt.Sprintf("svc-%d-%d", g, i%4)
		if err := st.DeleteService(name); err != nil && store.Code(err).String() != "NotFound" {
			t.Errorf("delete %s: %v", name, err)
			return
		}
		if _, err := st.CreateService(svc(name, 2000+g*10+i%4, i)); err != nil {
			t.Errorf("create %s: %v", name, err)
			return
		}
		addr := fmt.Sprintf("198.18.%d.%d", 20+g, 1+i%200)
		prev := fmt.Sprintf("198.18.%d.%d", 20+g, 1+(i+199)%200)
		if err := st.DeleteBackend(keep, prev, 8080); err != nil && store.Code(err).String() != "NotFound" {
			t.Errorf("delete backend: %v", err)
			return
		}
		if _, err := st.CreateBackend(keep, &lbdv1.Backend{Address: addr, Port: 8080}); err != nil {
			t.Errorf("create backend: %v", err)
			return
		}
	}
}

// TestIDReuseRacesTheReconciler: services and backends deleted and created again and
// again by several goroutines while the reconciler applies the changes to real maps.
// IDs freed by a deletion come back quickly; a stale operation on an ID that a new
// owner already holds would wipe the new owner's entries. When the churn stops, the
// maps hold exactly the store's services and backends.
func TestIDReuseRacesTheReconciler(t *testing.T) {
	const goroutines = 4
	rounds := 2500 // 10,000 in all
	if testing.Short() {
		rounds = 250
	}
	n := newNode(t)
	m := n.open(t, n.config(1<<16))
	st, err := store.Open(store.Options{Limits: store.DefaultLimits(), HoldIDs: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rec := reconcile.New(st, m, nil)
	done := make(chan error, 1)
	go func() { done <- rec.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})

	start := time.Now()
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() { churn(t, st, g, rounds) })
	}
	wg.Wait()
	t.Logf("%d rounds of delete-then-create in %v", goroutines*rounds, time.Since(start))
	if t.Failed() {
		return
	}

	deadline := time.Now().Add(time.Minute)
	for {
		pending := 0
		for _, s := range st.ListServices("") {
			if s.GetStatus().GetState() == lbdv1.ServiceState_SERVICE_STATE_PENDING {
				pending++
			}
		}
		if pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d services still pending a minute after the churn stopped", pending)
		}
		time.Sleep(20 * time.Millisecond)
	}
	checkMapsMatchStore(t, m, st)
}

// checkMapsMatchStore compares the LB maps with the store: the same services under the
// same IDs, the same backends under the same IDs, and tables over those backends only.
func checkMapsMatchStore(t *testing.T, m *Manager, st *store.Store) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	haveSvcs, err := m.lb.Services()
	if err != nil {
		t.Fatal(err)
	}
	haveBes, err := m.lb.Backends()
	if err != nil {
		t.Fatal(err)
	}
	wantSvcs := map[lbxdp.ServiceKey]uint32{}
	wantBes := map[uint32]lbxdp.Backend{}
	owner := map[uint32]uint32{} // backend ID → service ID
	for _, s := range st.ListServices("") {
		k := lbxdp.ServiceKey{VIP: netip.MustParseAddr(s.Vip), Port: uint16(s.Port), Proto: lbxdp.ProtoTCP}
		wantSvcs[k] = s.Id
		for _, b := range s.Backends {
			a := netip.MustParseAddr(b.Address)
			wantBes[b.Id] = lbxdp.Backend{Addr: a, Port: uint16(b.Port), Node: netip.MustParseAddr(b.NodeAddress)}
			owner[b.Id] = s.Id
		}
	}
	for k, id := range wantSvcs {
		if s, ok := haveSvcs[k]; !ok || s.ID != id {
			t.Errorf("service %v: maps hold %+v (present %v), store has ID %d", k, s, ok, id)
		}
	}
	for k, s := range haveSvcs {
		if _, ok := wantSvcs[k]; !ok {
			t.Errorf("maps hold service %v (ID %d) the store does not", k, s.ID)
		}
	}
	for id, b := range wantBes {
		if got, ok := haveBes[id]; !ok || got != b {
			t.Errorf("backend %d: maps hold %+v (present %v), store has %+v", id, got, ok, b)
		}
	}
	for id, b := range haveBes {
		if _, ok := wantBes[id]; !ok {
			t.Errorf("maps hold backend %d (%+v) the store does not", id, b)
		}
	}
	for _, id := range slices.Sorted(maps.Values(wantSvcs)) {
		table, err := m.lb.MaglevTable(id)
		if err != nil {
			t.Fatal(err)
		}
		if len(table) != 251 {
			t.Errorf("service %d: table of %d slots, want 251", id, len(table))
			continue
		}
		for _, bid := range table {
			if owner[bid] != id {
				t.Errorf("service %d: table slot holds backend %d of service %d", id, bid, owner[bid])
				break
			}
		}
	}
	if t.Failed() {
		t.Logf("%d services and %d backends in the store; %d and %d in the maps", len(wantSvcs), len(wantBes), len(haveSvcs), len(haveBes))
	}
}
