package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/lbd-dev/lbd/daemon/model"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/proto"
)

// Shared is where a fleet of nodes keeps its services (the etcd store, package
// fleetsync), when the store is not the node's alone. Every change of services made
// through this node is written there first; the changes of other nodes come back
// through ApplyShared. The state file then holds this node's copy, which it starts
// from while the shared store cannot be reached. BGP peers and the drain flag stay the
// node's own.
type Shared interface {
	// Commit writes a change of services (puts: whole services with their IDs;
	// deletes: names) on top of the shared state this store reflects. It is called
	// with the store's write lock held. Its error wraps ErrSharedConflict when the
	// shared state moved on, ErrSharedUnavailable when it cannot be reached.
	Commit(ctx context.Context, puts []*lbdv1.Service, deletes []string) error
	// Stale says why the services may be behind the shared state, or "".
	Stale() string
}

// Errors a Shared store's Commit wraps.
var (
	ErrSharedConflict    = errors.New("the fleet's services changed meanwhile")
	ErrSharedUnavailable = errors.New("the fleet's etcd store is unreachable")
)

// sharedError turns a Shared store's refusal into the API's answer.
func sharedError(err error) error {
	switch {
	case errors.Is(err, ErrSharedConflict):
		return aborted("%v", err)
	case errors.Is(err, ErrSharedUnavailable):
		return unavailable("%v", err)
	}
	return fmt.Errorf("write the fleet's services: %w", err)
}

// Stale says why the services this store serves may be behind the fleet's (the shared
// store cannot be reached, or has not been read since start), or "" when they are not.
func (s *Store) Stale() string {
	if s.opts.Shared == nil {
		return ""
	}
	return s.opts.Shared.Stale()
}

// SpecOnly returns a copy of a service without its output-only status, as a shared
// store keeps it.
func SpecOnly(svc *lbdv1.Service) *lbdv1.Service {
	c := proto.Clone(svc).(*lbdv1.Service)
	c.Status = nil
	for _, b := range c.Backends {
		b.Health, b.TableSlots, b.NodeReachability = nil, 0, lbdv1.Reachability_REACHABILITY_UNSPECIFIED
	}
	return c
}

// sharedChange lists what the transaction changes in services, for Shared.Commit.
func (t *txn) sharedChange() (puts []*lbdv1.Service, deletes []string) {
	for _, name := range slices.Sorted(maps.Keys(t.svcs)) {
		switch svc := t.svcs[name]; {
		case svc != nil:
			puts = append(puts, svc.Spec)
		case t.s.services[name] != nil:
			deletes = append(deletes, name)
		}
	}
	return puts, deletes
}

// ApplyShared makes a change that the shared store brought this node's: puts replace
// (or add) whole services with the IDs and revisions they have there, deletes remove
// services by name, and with full every service not in puts is removed too (a full
// read). Services that are already as given are left alone. guard runs first, under
// the write lock: when it returns false nothing is applied (a change this node wrote
// itself). A service this node cannot take (it fails validation here) is left out and
// logged: the fleet view shows it as diverged.
func (s *Store) ApplyShared(full bool, puts []*lbdv1.Service, deletes []string, guard func() bool) error {
	t := s.begin()
	if !guard() {
		t.abort()
		return nil
	}
	t.shared = true
	in := make(map[string]*model.Service, len(puts))
	for _, p := range puts {
		svc, err := sharedService(p, s.opts.Limits)
		if err != nil {
			s.log.Error("a service of the fleet is invalid here; left out", "op", "fleet", "service", p.GetName(), "error", err)
			continue
		}
		in[svc.Spec.Name] = svc
	}
	gone := slices.Clone(deletes)
	if full {
		for _, name := range s.names {
			if in[name] == nil {
				gone = append(gone, name)
			}
		}
	}
	for _, name := range gone {
		if old := t.service(name); old != nil && in[name] == nil {
			t.remove(old)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(in)) {
		svc, old := in[name], t.service(name)
		if old != nil && sameSpec(svc, old) && sameIDs(svc.Spec, old.Spec) && svc.Spec.Revision == old.Spec.Revision {
			continue
		}
		t.putShared(svc, old)
	}
	if len(t.events) == 0 {
		t.abort()
		return nil
	}
	return t.commit()
}

// SharedIDsHeld reports whether a service of a shared change uses an ID that this node
// still holds: its datapath has not yet applied the change that released it (on
// another node, the writer, it already has). Applying the change before would let the
// datapath meet the ID's new owner while the old one's entries are still there, so
// the caller waits (fleetsync).
func (s *Store) SharedIDsHeld(svcs []*lbdv1.Service) bool {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	for _, svc := range svcs {
		if old := s.services[svc.Name]; old != nil && old.Spec.Id == svc.Id {
			continue // its own ID, not a reuse
		}
		if s.svcIDs.isHeld(svc.Id) {
			return true
		}
	}
	for _, svc := range svcs {
		own := map[uint32]bool{}
		if old := s.services[svc.Name]; old != nil {
			for _, b := range old.Spec.Backends {
				own[b.Id] = true
			}
		}
		for _, b := range svc.Backends {
			if !own[b.Id] && s.beIDs.isHeld(b.Id) {
				return true
			}
		}
	}
	return false
}

// putShared stores a service as the shared store holds it, IDs included.
func (t *txn) putShared(svc, old *model.Service) {
	typ := Added
	if old != nil {
		t.freeFrontend(frontendOf(old), old.Spec.Name)
		typ = Modified
	}
	name := svc.Spec.Name
	t.setService(name, svc)
	t.fronts[frontendOf(svc)] = name
	t.events = append(t.events, Event{Type: typ, Name: name, Service: svc})
}

// sameIDs reports whether two services with the same backends have the same IDs.
func sameIDs(a, b *lbdv1.Service) bool {
	if a.Id != b.Id || len(a.Backends) != len(b.Backends) {
		return false
	}
	for i := range a.Backends {
		if a.Backends[i].Id != b.Backends[i].Id {
			return false
		}
	}
	return true
}

// sharedService checks a service of the shared store as strictly as API input and
// keeps its IDs and revision.
func sharedService(in *lbdv1.Service, lim Limits) (*model.Service, error) {
	svc, verr := normalizeStored(in, lim)
	if verr != nil {
		return nil, verr
	}
	if svc.Spec.Id == 0 {
		return nil, errors.New("no id")
	}
	for i, b := range svc.Spec.Backends {
		if b.Id == 0 {
			return nil, fmt.Errorf("backend %s: no id", svc.Backends[i].Addr)
		}
	}
	return svc, nil
}

// rebuildIDs recomputes the ID allocators from the services after a shared change,
// whose IDs another node handed out. With HoldIDs every free ID is held until the
// datapath applied this change: the change may have released some.
func (s *Store) rebuildIDs(seq uint64) {
	var svcIDs, beIDs []uint32
	for _, svc := range s.services {
		svcIDs = append(svcIDs, svc.Spec.Id)
		for _, b := range svc.Spec.Backends {
			beIDs = append(beIDs, b.Id)
		}
	}
	s.svcIDs = rebuiltAlloc(svcIDs, s.svcIDs.next, s.opts.HoldIDs, seq, s.svcIDs.max)
	s.beIDs = rebuiltAlloc(beIDs, s.beIDs.next, s.opts.HoldIDs, seq, s.beIDs.max)
}

// rebuiltAlloc is an allocator for the IDs in use; every other ID below the larger of
// their end and prevNext (the IDs handed out so far, which the change may have
// released) is free, or with hold held until the change with Seq seq is reconciled.
func rebuiltAlloc(used []uint32, prevNext uint32, hold bool, seq uint64, max uint32) idAlloc {
	a := newIDAlloc(used, hold, max)
	for ; a.next < prevNext; a.next++ {
		if hold {
			a.held = append(a.held, heldID{id: a.next})
		} else {
			a.free = append(a.free, a.next)
		}
	}
	for i := range a.held {
		a.held[i].seq = seq
	}
	return a
}
