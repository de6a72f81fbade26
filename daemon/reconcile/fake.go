package reconcile

import (
	"context"
	"sync"

	"github.com/lbd-dev/lbd/daemon/model"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/proto"
)

// Fake is an in-memory Datapath for tests of everything above the kernel. It records the
// services it holds by ID and every call it received.
type Fake struct {
	mu       sync.Mutex
	services map[uint32]*lbdv1.Service
	calls    []string
	batches  []int
	// Fail, when set, makes Apply fail the services with this name with this error.
	Fail map[string]error
}

// NewFake returns an empty fake datapath.
func NewFake() *Fake { return &Fake{services: map[uint32]*lbdv1.Service{}, Fail: map[string]error{}} }

// Sync implements Datapath.
func (f *Fake) Sync(_ context.Context, svcs []*model.Service) (map[string]map[uint32]uint32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "sync")
	f.services = map[uint32]*lbdv1.Service{}
	out := map[string]map[uint32]uint32{}
	for _, m := range svcs {
		s := m.Spec
		f.services[s.Id] = proto.Clone(s).(*lbdv1.Service)
		out[s.Name] = fakeSlots(s)
	}
	return out, nil
}

// Apply implements Datapath: removals, then the rest, in name order within each.
func (f *Fake) Apply(_ context.Context, deletes, upserts []*model.Service) (map[uint32]map[uint32]uint32, map[uint32]error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	slots, errs := map[uint32]map[uint32]uint32{}, map[uint32]error{}
	f.batches = append(f.batches, len(deletes)+len(upserts))
	for _, m := range deletes {
		s := m.Spec
		f.calls = append(f.calls, "delete "+s.Name)
		delete(f.services, s.Id)
	}
	for _, m := range upserts {
		s := m.Spec
		f.calls = append(f.calls, "upsert "+s.Name)
		if err := f.Fail[s.Name]; err != nil {
			errs[s.Id] = err
			continue
		}
		f.services[s.Id] = proto.Clone(s).(*lbdv1.Service)
		slots[s.Id] = fakeSlots(s)
	}
	return slots, errs
}

// Services returns copies of the services the fake holds, keyed by ID.
func (f *Fake) Services() map[uint32]*lbdv1.Service {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[uint32]*lbdv1.Service, len(f.services))
	for id, s := range f.services {
		out[id] = proto.Clone(s).(*lbdv1.Service)
	}
	return out
}

// Batches returns how many changes each Apply call carried.
func (f *Fake) Batches() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.batches...)
}

// Calls returns the calls received so far.
func (f *Fake) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

// fakeSlots gives each active backend one slot, enough for status plumbing tests.
func fakeSlots(s *lbdv1.Service) map[uint32]uint32 {
	m := map[uint32]uint32{}
	for _, b := range s.Backends {
		if b.State == lbdv1.BackendState_BACKEND_STATE_ACTIVE {
			m[b.Id] = 1
		}
	}
	return m
}
