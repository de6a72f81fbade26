package reconcile

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

func svc(name, vip string, backends ...string) *lbdv1.Service {
	s := &lbdv1.Service{Name: name, Vip: vip, Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP}
	for _, b := range backends {
		s.Backends = append(s.Backends, &lbdv1.Backend{Address: b, Port: 80})
	}
	return s
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestReconcilerFollowsStoreAndReportsStatus(t *testing.T) {
	st, err := store.Open(store.Options{Limits: store.DefaultLimits()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateService(svc("pre", "203.0.113.1", "198.18.0.1")); err != nil {
		t.Fatal(err)
	}
	fake := NewFake()
	fake.Fail["broken"] = errors.New("map full")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	r := New(st, fake, nil)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	state := func(name string) lbdv1.ServiceState {
		s, err := st.GetService(name)
		if err != nil {
			return lbdv1.ServiceState_SERVICE_STATE_UNSPECIFIED
		}
		return s.Status.State
	}
	eventually(t, "pre synced", func() bool { return state("pre") == lbdv1.ServiceState_SERVICE_STATE_READY })

	if _, err := st.CreateService(svc("web", "203.0.113.2", "198.18.0.2", "198.18.0.3")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "web ready", func() bool { return state("web") == lbdv1.ServiceState_SERVICE_STATE_READY })
	for _, addr := range []string{"198.18.0.2", "198.18.0.3"} {
		if _, err := st.UpdateBackend("web", &lbdv1.Backend{Address: addr, Port: 80, State: lbdv1.BackendState_BACKEND_STATE_DISABLED}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "web without backends", func() bool { return state("web") == lbdv1.ServiceState_SERVICE_STATE_NO_BACKENDS })
	s, _ := st.GetService("web")
	if s.Status.Reason == "" || s.Status.UsableBackends != 0 {
		t.Errorf("status %v", s.Status)
	}
	if _, err := st.CreateService(svc("broken", "203.0.113.3", "198.18.0.4")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "broken in error", func() bool { return state("broken") == lbdv1.ServiceState_SERVICE_STATE_ERROR })
	b, _ := st.GetService("broken")
	if b.Status.Reason != "datapath: map full" {
		t.Errorf("error reason %q", b.Status.Reason)
	}

	// Delete and re-create under the same name: the datapath must drop the old ID.
	pre, _ := st.GetService("pre")
	if err := st.DeleteService("pre"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateService(svc("other", "203.0.113.9", "198.18.0.9")); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateService(svc("pre", "203.0.113.8", "198.18.0.8")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pre re-created", func() bool {
		for _, s := range fake.Services() {
			if s.Name == "pre" && s.Vip == "203.0.113.8" {
				return true
			}
		}
		return false
	})
	n := 0
	for id, s := range fake.Services() {
		if s.Name == "pre" {
			n++
		}
		if id == pre.Id && s.Vip == "203.0.113.1" {
			t.Errorf("old pre (id %d) still in the datapath", id)
		}
	}
	if n != 1 {
		t.Errorf("%d copies of pre in the datapath", n)
	}
	if got := fake.Calls(); got[0] != "sync" {
		t.Errorf("first call %q, want sync", got[0])
	}
}

func TestReconcilerCoalescesBursts(t *testing.T) {
	st, err := store.Open(store.Options{Limits: store.DefaultLimits()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateService(svc("web", "203.0.113.2", "198.18.0.2")); err != nil {
		t.Fatal(err)
	}
	fake := NewFake()
	r := New(st, fake, nil)
	// Changes made before Run starts are all covered by the initial sync.
	for i := range 50 {
		if _, err := st.UpdateBackend("web", &lbdv1.Backend{Address: "198.18.0.2", Port: 80, Weight: uint32(i + 2)}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	eventually(t, "weight 51 programmed", func() bool {
		for _, s := range fake.Services() {
			if s.Backends[0].Weight == 51 {
				return true
			}
		}
		return false
	})
	if calls := fake.Calls(); len(calls) > 2 {
		t.Errorf("%d datapath calls for changes made before start, want the sync only: %v", len(calls), calls)
	}
}

// TestReconcilerAppliesABurstInOneBatch: services applied at once reach the datapath
// in one call, and one that fails there fails alone.
func TestReconcilerAppliesABurstInOneBatch(t *testing.T) {
	st, err := store.Open(store.Options{Limits: store.DefaultLimits()})
	if err != nil {
		t.Fatal(err)
	}
	fake := NewFake()
	fake.Fail["svc-7"] = errors.New("map full")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	r := New(st, fake, nil)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	eventually(t, "the initial sync", func() bool { return len(fake.Calls()) > 0 })

	var svcs []*lbdv1.Service
	for i := range 500 {
		svcs = append(svcs, svc(fmt.Sprintf("svc-%d", i), fmt.Sprintf("203.0.113.%d", i%250+1), fmt.Sprintf("198.18.%d.%d", i/250, i%250+1)))
		svcs[i].Port = uint32(80 + i/250)
	}
	if _, err := st.ApplyServices("o", svcs); err != nil {
		t.Fatal(err)
	}
	eventually(t, "499 services in the datapath", func() bool { return len(fake.Services()) == 499 })
	if b := fake.Batches(); len(b) != 1 || b[0] != 500 {
		t.Errorf("the datapath got batches of %v changes, want one of 500", b)
	}
	eventually(t, "svc-7 in error", func() bool {
		s, err := st.GetService("svc-7")
		return err == nil && s.Status.State == lbdv1.ServiceState_SERVICE_STATE_ERROR
	})
	if s, _ := st.GetService("svc-8"); s.Status.State != lbdv1.ServiceState_SERVICE_STATE_READY {
		t.Errorf("svc-8: %v, want READY beside the failed svc-7", s.Status)
	}
}
