package store

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/lbd-dev/lbd/daemon/model"
	statev1 "github.com/lbd-dev/lbd/proto/lbd/state/v1"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/proto"
)

// txn is a transaction: the services and frontends it changes sit in overlays over the
// published maps, so that its cost is that of the change, not of the whole state.
// Nothing is visible until commit. A transaction holds writeMu, which is what every
// change of the published services and frontends also holds: reading them without mu
// is safe here.
type txn struct {
	s *Store
	// svcs are the services the transaction changed, by name; nil: removed.
	svcs map[string]*model.Service
	// fronts are the frontends it changed; "": freed.
	fronts map[frontendKey]string
	// peers are all peers (a few dozen at most), copied.
	peers   map[netip.Addr]*lbdv1.BgpPeer
	drained bool
	// nsvc and nbe count the services and backends after the transaction; tableBytes
	// the memory of the tables, when tableBytesKnown (checkMemory).
	nsvc, nbe       int
	tableBytes      uint64
	tableBytesKnown bool
	svcIDs          idTxn
	beIDs           idTxn
	events          []Event
	// shared marks a change that the shared store brought (ApplyShared): it is not
	// written back, its IDs are the fleet's, and the fleet already checked its limits.
	shared bool
	// check is the caller's owner check (Writer); nil: none.
	check OwnerCheck
}

func (s *Store) begin() *txn {
	s.writeMu.Lock()
	return &txn{
		s:       s,
		svcs:    map[string]*model.Service{},
		fronts:  map[frontendKey]string{},
		peers:   maps.Clone(s.peers),
		drained: s.drained,
		nsvc:    len(s.services),
		nbe:     s.backends,
		svcIDs:  s.svcIDs.begin(),
		beIDs:   s.beIDs.begin(),
	}
}

// service returns the service named name as the transaction sees it, or nil.
func (t *txn) service(name string) *model.Service {
	if svc, ok := t.svcs[name]; ok {
		return svc
	}
	return t.s.services[name]
}

// frontend returns the name of the service that uses fk, as the transaction sees it.
func (t *txn) frontend(fk frontendKey) (string, bool) {
	if name, ok := t.fronts[fk]; ok {
		return name, name != ""
	}
	name, ok := t.s.frontends[fk]
	return name, ok
}

// setService replaces (or, with nil, removes) the service named name.
func (t *txn) setService(name string, svc *model.Service) {
	if old := t.service(name); old != nil {
		t.nsvc--
		t.nbe -= len(old.Backends)
	}
	if svc != nil {
		t.nsvc++
		t.nbe += len(svc.Backends)
	}
	t.svcs[name] = svc
}

// freeFrontend frees fk if the service named owner holds it: a frontend that another
// service of the same transaction took over stays with it.
func (t *txn) freeFrontend(fk frontendKey, owner string) {
	if name, ok := t.frontend(fk); ok && name == owner {
		t.fronts[fk] = ""
	}
}

// checkBackendTotal enforces Limits.MaxBackends over all services of the transaction.
func (t *txn) checkBackendTotal() error {
	if lim := t.s.opts.Limits.MaxBackends; t.nbe > lim {
		return failedPrecondition("", "%d backends in all would exceed the limit of %d", t.nbe, lim)
	}
	return nil
}

// checkMemory enforces Options.Memory over all services of the transaction. Every
// service counts with its table, even one without a usable backend yet: it gets one as
// soon as a backend becomes usable, with no API call to refuse. The total is kept
// change by change; it is added up once, when the budget is first known.
func (t *txn) checkMemory() error {
	s := t.s
	var b MemoryBudget
	if s.opts.Memory != nil {
		b = s.opts.Memory()
	}
	if b.Unknown != "" {
		for name, svc := range t.svcs {
			if grows(s.services[name], svc) {
				return unavailable("%s; try again in a moment", b.Unknown)
			}
		}
	}
	if b.Unknown != "" || b.TableBytes == nil {
		return nil
	}
	total := s.tableBytes
	if !s.tableBytesKnown {
		total = 0
		for _, svc := range s.services {
			total += b.TableBytes(svc.Spec)
		}
	}
	for name, svc := range t.svcs {
		if old := s.services[name]; old != nil {
			total -= b.TableBytes(old.Spec)
		}
		if svc != nil {
			total += b.TableBytes(svc.Spec)
		}
	}
	if total > b.Tables {
		return resourceExhausted("the Maglev tables of %d services would take %s of kernel memory, more than the %s that %s (%s) leaves for them once the other maps are counted",
			t.nsvc, humanBytes(total), humanBytes(b.Tables), b.Setting, humanBytes(b.Total))
	}
	t.tableBytes, t.tableBytesKnown = total, true
	return nil
}

// grows reports whether a change from old to svc (nil: none) could make the tables take
// more memory, whatever their sizing: a new service, or one with more backends, a
// higher total weight or another table size.
func grows(old, svc *model.Service) bool {
	switch {
	case svc == nil:
		return false
	case old == nil:
		return true
	}
	weights := func(s *lbdv1.Service) (w uint64) {
		for _, b := range s.Backends {
			w += uint64(b.Weight)
		}
		return w
	}
	return len(svc.Backends) > len(old.Backends) || svc.Spec.MaglevTableSize != old.Spec.MaglevTableSize || weights(svc.Spec) > weights(old.Spec)
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

// touchesServices reports whether the transaction changes services (not only the
// node's own peers or drain flag).
func (t *txn) touchesServices() bool { return len(t.svcs) > 0 }

// checkLimits enforces the limits that apply to the whole state after the transaction.
func (t *txn) checkLimits() error {
	if err := t.checkBackendTotal(); err != nil {
		return err
	}
	if err := t.svcIDs.check("service", "max_services"); err != nil {
		return err
	}
	if err := t.beIDs.check("backend", "max_backends"); err != nil {
		return err
	}
	return t.checkMemory()
}

// abort ends a transaction without effect.
func (t *txn) abort() { t.s.writeMu.Unlock() }

// commit persists the transaction's change, publishes it and notifies listeners. On a
// write error nothing is published.
func (t *txn) commit() error {
	s := t.s
	defer s.writeMu.Unlock()
	if err := t.checkOwners(); err != nil {
		return err
	}
	if !t.shared {
		if err := t.checkLimits(); err != nil {
			return err
		}
	}
	if s.opts.Shared != nil && !t.shared {
		if puts, deletes := t.sharedChange(); len(puts)+len(deletes) > 0 {
			if err := s.opts.Shared.Commit(context.Background(), puts, deletes); err != nil {
				s.log.Warn("change refused by the fleet's store", "op", "fleet", "error", err)
				return sharedError(err)
			}
		}
	}
	if s.disk != nil {
		if err := s.disk.append(t.journalEntry(), s.snapshot); err != nil {
			if s.opts.Shared == nil || !t.touchesServices() {
				s.log.Error("state not saved; change rejected", "op", "persist", "path", s.opts.Path, "error", err)
				return fmt.Errorf("save state: %w", err)
			}
			// The fleet holds the change already: it is the node's state whatever its
			// copy says, and a start reads the fleet before trusting the copy.
			s.log.Error("the local copy of the fleet's services not saved", "op", "persist", "path", s.opts.Path, "error", err)
		}
	}
	s.mu.Lock()
	t.publish()
	s.seq++
	if t.shared {
		s.rebuildIDs(s.seq)
	} else {
		t.svcIDs.commit(s.seq)
		t.beIDs.commit(s.seq)
	}
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
			for _, b := range ev.Service.Spec.Backends {
				live[b.Id] = true
			}
			maps.DeleteFunc(rt.health, func(id uint32, _ *lbdv1.BackendHealth) bool { return !live[id] })
			maps.DeleteFunc(rt.tableSlots, func(id uint32, _ uint32) bool { return !live[id] })
		}
		t.events[i].Service = s.typedWithStatus(ev.Service)
	}
	s.mu.Unlock()
	s.notify(t.events)
	if s.disk != nil {
		s.disk.maybeCompact(s.snapshot)
	}
	return nil
}

// publish makes the transaction's change the store's state. Caller holds writeMu and mu.
func (t *txn) publish() {
	s := t.s
	var added []string
	removed := map[string]bool{}
	for name, svc := range t.svcs {
		old, existed := s.services[name]
		if existed {
			s.indexNodes(old, -1)
		}
		switch {
		case svc == nil && existed:
			delete(s.services, name)
			removed[name] = true
		case svc != nil:
			if !existed {
				added = append(added, name)
			}
			s.services[name] = svc
			s.indexNodes(svc, 1)
		}
	}
	if len(added) > 0 || len(removed) > 0 {
		slices.Sort(added)
		s.names = mergeNames(s.names, added, removed)
	}
	for fk, name := range t.fronts {
		if name == "" {
			delete(s.frontends, fk)
		} else {
			s.frontends[fk] = name
		}
	}
	s.tableBytes, s.tableBytesKnown = t.tableBytes, t.tableBytesKnown
	s.backends = t.nbe
	s.peers, s.drained = t.peers, t.drained
}

// mergeNames returns the sorted names without those removed and with those added
// (sorted, none already present), in one pass.
func mergeNames(names, added []string, removed map[string]bool) []string {
	out := make([]string, 0, len(names)+len(added)-len(removed))
	i := 0
	for _, n := range names {
		for i < len(added) && added[i] < n {
			out = append(out, added[i])
			i++
		}
		if !removed[n] {
			out = append(out, n)
		}
	}
	return append(out, added[i:]...)
}

// journalEntry is what the transaction changes, for the journal.
func (t *txn) journalEntry() *statev1.JournalEntry {
	s := t.s
	e := &statev1.JournalEntry{}
	for _, name := range slices.Sorted(maps.Keys(t.svcs)) {
		switch svc := t.svcs[name]; {
		case svc != nil:
			e.Services = append(e.Services, svc.Spec)
		case s.services[name] != nil:
			e.DeletedServices = append(e.DeletedServices, name)
		}
	}
	for _, addr := range slices.SortedFunc(maps.Keys(t.peers), netip.Addr.Compare) {
		if p := t.peers[addr]; s.peers[addr] != p {
			e.BgpPeers = append(e.BgpPeers, p)
		}
	}
	for _, addr := range slices.SortedFunc(maps.Keys(s.peers), netip.Addr.Compare) {
		if _, ok := t.peers[addr]; !ok {
			e.DeletedBgpPeers = append(e.DeletedBgpPeers, addr.String())
		}
	}
	if t.drained != s.drained {
		e.NodeDrained = proto.Bool(t.drained)
	}
	return e
}

// snapshot is the whole state as the journal's last entry left it. Caller holds writeMu.
// The services are shared, not copied: stored services are never modified.
func (s *Store) snapshot() *statev1.State {
	st := &statev1.State{NodeDrained: s.drained, Services: make([]*lbdv1.Service, 0, len(s.names))}
	for _, name := range s.names {
		st.Services = append(st.Services, s.services[name].Spec)
	}
	for _, addr := range slices.SortedFunc(maps.Keys(s.peers), netip.Addr.Compare) {
		st.BgpPeers = append(st.BgpPeers, s.peers[addr])
	}
	return st
}

// put stores a normalized service, assigning IDs: the service keeps its ID, and each
// backend keeps the ID of the backend with the same address and port in old (if any).
func (t *txn) put(svc *model.Service, old *model.Service) {
	oldIDs := map[netip.AddrPort]uint32{}
	spec := svc.Spec
	if old != nil {
		spec.Id, spec.Revision = old.Spec.Id, old.Spec.Revision+1
		for i, b := range old.Spec.Backends {
			oldIDs[old.Backends[i].Addr] = b.Id
		}
		t.freeFrontend(frontendOf(old), old.Spec.Name)
	} else {
		spec.Id, spec.Revision = t.svcIDs.get(), 1
	}
	for i, b := range spec.Backends {
		k := svc.Backends[i].Addr
		if id, ok := oldIDs[k]; ok {
			b.Id = id
			delete(oldIDs, k)
		} else {
			b.Id = t.beIDs.get()
		}
	}
	for _, id := range slices.Sorted(maps.Values(oldIDs)) {
		t.beIDs.put(id)
	}
	t.setService(spec.Name, svc)
	t.fronts[frontendOf(svc)] = spec.Name
	typ := Added
	if old != nil {
		typ = Modified
	}
	t.events = append(t.events, Event{Type: typ, Name: spec.Name, Service: svc})
}

func (t *txn) remove(old *model.Service) {
	name := old.Spec.Name
	t.setService(name, nil)
	t.freeFrontend(frontendOf(old), name)
	t.svcIDs.put(old.Spec.Id)
	for _, b := range old.Spec.Backends {
		t.beIDs.put(b.Id)
	}
	t.events = append(t.events, Event{Type: Deleted, Name: name, Service: old})
}

// checkFrontend reports a conflict of svc's frontend with another service.
func (t *txn) checkFrontend(svc *model.Service) error {
	fk := frontendOf(svc)
	if other, ok := t.frontend(fk); ok && other != svc.Spec.Name {
		return alreadyExists("service.vip", "frontend %s is already used by service %q", fk, other)
	}
	return nil
}

// sameSpec reports whether the normalized service a has the same spec as the stored
// service b (IDs, revision and status aside). It borrows b's IDs into a for the
// comparison and restores a afterwards, which avoids cloning either.
func sameSpec(as, bs *model.Service) bool {
	if len(as.Backends) != len(bs.Backends) {
		return false
	}
	for i := range as.Backends {
		if as.Backends[i].Addr != bs.Backends[i].Addr {
			return false
		}
	}
	a, b := as.Spec, bs.Spec
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
