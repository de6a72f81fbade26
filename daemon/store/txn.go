package store

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	statev1 "github.com/lbd-dev/lbd/proto/lbd/state/v1"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/proto"
)

// txn is a transaction: copies of the maps that a mutation edits freely. Nothing is
// visible until commit.
type txn struct {
	s         *Store
	services  map[string]*lbdv1.Service
	frontends map[frontendKey]string
	peers     map[string]*lbdv1.BgpPeer
	drained   bool
	svcIDs    idTxn
	beIDs     idTxn
	events    []Event
}

func (s *Store) begin() *txn {
	s.writeMu.Lock()
	s.mu.RLock()
	defer s.mu.RUnlock()
	return &txn{
		s:         s,
		services:  maps.Clone(s.services),
		frontends: maps.Clone(s.frontends),
		peers:     maps.Clone(s.peers),
		drained:   s.drained,
		svcIDs:    s.svcIDs.begin(),
		beIDs:     s.beIDs.begin(),
	}
}

// checkBackendTotal enforces Limits.MaxBackends over all services of the transaction.
func (t *txn) checkBackendTotal() error {
	n := 0
	for _, svc := range t.services {
		n += len(svc.Backends)
	}
	if lim := t.s.opts.Limits.MaxBackends; n > lim {
		return failedPrecondition("", "%d backends in all would exceed the limit of %d", n, lim)
	}
	return nil
}

// checkMemory enforces Options.Memory over all services of the transaction. Every
// service counts with its table, even one without a usable backend yet: it gets one as
// soon as a backend becomes usable, with no API call to refuse.
func (t *txn) checkMemory() error {
	if t.s.opts.Memory == nil {
		return nil
	}
	b := t.s.opts.Memory()
	if b.TableBytes == nil {
		return nil
	}
	var need uint64
	for _, svc := range t.services {
		need += b.TableBytes(svc.MaglevTableSize)
	}
	if need > b.Tables {
		return resourceExhausted("the Maglev tables of %d services would take %s of kernel memory, more than the %s that %s (%s) leaves for them once the other maps are counted",
			len(t.services), humanBytes(need), humanBytes(b.Tables), b.Setting, humanBytes(b.Total))
	}
	return nil
}

// humanBytes writes a byte count in binary units.
func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// abort ends a transaction without effect.
func (t *txn) abort() { t.s.writeMu.Unlock() }

// commit persists the transaction's state, publishes it and notifies listeners. On a
// write error nothing is published.
func (t *txn) commit() error {
	s := t.s
	defer s.writeMu.Unlock()
	if err := t.checkBackendTotal(); err != nil {
		return err
	}
	if err := t.checkMemory(); err != nil {
		return err
	}
	if s.opts.Path != "" {
		data, err := encodeState(t.state())
		if err != nil {
			return err
		}
		if err := writeFileAtomic(s.opts.Path, data); err != nil {
			s.log.Error("state not saved; change rejected", "op", "persist", "path", s.opts.Path, "error", err)
			return fmt.Errorf("save state: %w", err)
		}
	}
	s.mu.Lock()
	s.services, s.frontends, s.peers, s.drained = t.services, t.frontends, t.peers, t.drained
	s.seq++
	t.svcIDs.commit(s.seq)
	t.beIDs.commit(s.seq)
	for i, ev := range t.events {
		t.events[i].Seq = s.seq
		if ev.Type == Node {
			continue
		}
		if ev.Type == Deleted {
			delete(s.status, ev.Name)
			continue
		}
		s.runtime(ev.Name).wantSeq = s.seq
		// Output-only data of backends that left the service must not pass to a new
		// backend that reuses the ID.
		if rt := s.status[ev.Name]; rt != nil {
			live := make(map[uint32]bool, len(ev.Service.Backends))
			for _, b := range ev.Service.Backends {
				live[b.Id] = true
			}
			maps.DeleteFunc(rt.health, func(id uint32, _ *lbdv1.BackendHealth) bool { return !live[id] })
			maps.DeleteFunc(rt.tableSlots, func(id uint32, _ uint32) bool { return !live[id] })
		}
		t.events[i].Service = s.withStatus(ev.Service)
	}
	s.mu.Unlock()
	s.notify(t.events)
	return nil
}

func (t *txn) state() *statev1.State {
	st := &statev1.State{NodeDrained: t.drained}
	for _, name := range slices.Sorted(maps.Keys(t.services)) {
		st.Services = append(st.Services, t.services[name])
	}
	for _, addr := range slices.Sorted(maps.Keys(t.peers)) {
		st.BgpPeers = append(st.BgpPeers, t.peers[addr])
	}
	return st
}

// put stores a normalized service, assigning IDs: the service keeps its ID, and each
// backend keeps the ID of the backend with the same address and port in old (if any).
func (t *txn) put(svc *lbdv1.Service, old *lbdv1.Service) {
	oldIDs := map[netip.AddrPort]uint32{}
	if old != nil {
		svc.Id, svc.Revision = old.Id, old.Revision+1
		for _, b := range old.Backends {
			oldIDs[backendKey(b)] = b.Id
		}
		delete(t.frontends, frontendOf(old))
	} else {
		svc.Id, svc.Revision = t.svcIDs.get(), 1
	}
	for _, b := range svc.Backends {
		k := backendKey(b)
		if id, ok := oldIDs[k]; ok {
			b.Id = id
			delete(oldIDs, k)
		} else {
			b.Id = t.beIDs.get()
		}
	}
	for _, id := range oldIDs {
		t.beIDs.put(id)
	}
	t.services[svc.Name] = svc
	t.frontends[frontendOf(svc)] = svc.Name
	typ := Added
	if old != nil {
		typ = Modified
	}
	t.events = append(t.events, Event{Type: typ, Name: svc.Name, Service: svc})
}

func (t *txn) remove(old *lbdv1.Service) {
	delete(t.services, old.Name)
	delete(t.frontends, frontendOf(old))
	t.svcIDs.put(old.Id)
	for _, b := range old.Backends {
		t.beIDs.put(b.Id)
	}
	t.events = append(t.events, Event{Type: Deleted, Name: old.Name, Service: old})
}

// checkFrontend reports a conflict of svc's frontend with another service.
func (t *txn) checkFrontend(svc *lbdv1.Service) error {
	fk := frontendOf(svc)
	if other, ok := t.frontends[fk]; ok && other != svc.Name {
		return alreadyExists("service.vip", "frontend %s is already used by service %q", fk, other)
	}
	return nil
}

// sameSpec reports whether the normalized service a has the same spec as the stored
// service b (IDs, revision and status aside). It borrows b's IDs into a for the
// comparison and restores a afterwards, which avoids cloning either.
func sameSpec(a, b *lbdv1.Service) bool {
	if len(a.Backends) != len(b.Backends) {
		return false
	}
	for i := range a.Backends {
		if backendKey(a.Backends[i]) != backendKey(b.Backends[i]) {
			return false
		}
	}
	ids := make([]uint32, len(a.Backends))
	for i, be := range a.Backends {
		ids[i], be.Id = be.Id, b.Backends[i].Id
	}
	id, rev, st := a.Id, a.Revision, a.Status
	a.Id, a.Revision, a.Status = b.Id, b.Revision, b.Status
	eq := proto.Equal(a, b)
	a.Id, a.Revision, a.Status = id, rev, st
	for i, be := range a.Backends {
		be.Id = ids[i]
	}
	return eq
}
