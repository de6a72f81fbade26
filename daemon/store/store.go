// Package store holds lbd's desired state: services, their backends, BGP peers and the
// node's drain flag. It validates every change, persists the whole state atomically
// before acknowledging it, restores it at start, and pushes each change to listeners
// (the reconciler, API watchers).
//
// Every mutation runs as a transaction on copies of the maps: validation, ID allocation
// and the write of the state file happen before anything becomes visible, so a rejected
// or failed change leaves the store exactly as it was.
package store

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	statev1 "github.com/lbd-dev/lbd/proto/lbd/state/v1"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/proto"
)

// EventType says what happened to a service.
type EventType int

// Event types.
const (
	Added EventType = iota + 1
	Modified
	Deleted
	// Node reports a change of node-level state: the drain flag or the BGP peers. Its
	// Name and Service are empty.
	Node
)

// Event reports one change of a service.
type Event struct {
	Type EventType
	Name string
	// Service is the service after the change, or before it for Deleted. Listeners must
	// not modify it.
	Service *lbdv1.Service
	// StatusOnly is set when only the datapath's own report changed the service (its
	// output-only status): the reconciler ignores those. Health changes are not
	// StatusOnly, since they change which backends take new flows.
	StatusOnly bool
}

// Listener receives changes in commit order. It is called with the store's write lock
// held and must not block or call back into the store.
type Listener func([]Event)

// Options configure a store.
type Options struct {
	// Path of the state file. Empty keeps the state in memory only (tests).
	Path   string
	Limits Limits
	Logger hclog.Logger
	// StatusReason, when set, is reported as the reason of every service's PENDING state:
	// the node has no datapath that could program it (control-plane-only mode).
	StatusReason string
	// AdvertiseReason explains why VIPs are not advertised while the node runs no BGP.
	AdvertiseReason string
}

// Store is the desired-state store. It is safe for concurrent use.
type Store struct {
	opts Options
	log  hclog.Logger
	lock *os.File

	writeMu sync.Mutex // serializes transactions, held while the state file is written

	mu        sync.RWMutex // guards the published state below
	services  map[string]*lbdv1.Service
	frontends map[frontendKey]string
	peers     map[string]*lbdv1.BgpPeer
	drained   bool
	svcIDs    idAlloc
	beIDs     idAlloc
	status    map[string]*serviceRuntime
	listeners map[int]Listener
	nextLID   int
}

// serviceRuntime is output-only information about a service, reported by the reconciler
// and the health checker; it is not persisted.
type serviceRuntime struct {
	appliedRevision uint64
	datapathErr     string
	tableSlots      map[uint32]uint32
	health          map[uint32]*lbdv1.BackendHealth
	updated         time.Time
	// advertised and advertiseReason come from the BGP advertiser; hasAdvertise is false
	// until it reported.
	hasAdvertise    bool
	advertised      bool
	advertiseReason string
}

// Open restores the store from opts.Path, or starts empty if the file does not exist. A
// state file that exists but cannot be read or trusted is an error wrapping
// ErrCorruptState; the file is not touched.
func Open(opts Options) (*Store, error) {
	if err := opts.Limits.Validate(); err != nil {
		return nil, fmt.Errorf("invalid limits: %w", err)
	}
	s := &Store{
		opts:      opts,
		log:       opts.Logger,
		services:  map[string]*lbdv1.Service{},
		frontends: map[frontendKey]string{},
		peers:     map[string]*lbdv1.BgpPeer{},
		status:    map[string]*serviceRuntime{},
		listeners: map[int]Listener{},
	}
	if s.log == nil {
		s.log = hclog.NewNullLogger()
	}
	var st *statev1.State
	if opts.Path != "" {
		if err := s.lockDir(); err != nil {
			return nil, err
		}
		var err error
		if st, err = readStateFile(opts.Path); err != nil {
			s.Close()
			return nil, fmt.Errorf("%s: %w", opts.Path, err)
		}
	}
	if err := s.restore(st); err != nil {
		s.Close()
		return nil, fmt.Errorf("%s: %w: %v", opts.Path, ErrCorruptState, err)
	}
	return s, nil
}

// lockDir takes an exclusive lock next to the state file so that two daemons never write
// the same state.
func (s *Store) lockDir() error {
	dir := filepath.Dir(s.opts.Path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create state directory: %w", err)
	}
	f, err := os.OpenFile(s.opts.Path+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("open state lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return fmt.Errorf("lock %s: another lbd uses this state file: %w", f.Name(), err)
	}
	s.lock = f
	return nil
}

// Close releases the state file lock.
func (s *Store) Close() error {
	if s.lock == nil {
		return nil
	}
	err := s.lock.Close()
	s.lock = nil
	return err
}

// restore loads a decoded state, checking it as strictly as API input: a file that lbd
// itself could not have written is not trusted.
func (s *Store) restore(st *statev1.State) error {
	if st == nil {
		s.svcIDs, s.beIDs = newIDAlloc(nil), newIDAlloc(nil)
		return nil
	}
	var svcIDs, beIDs []uint32
	seenSvc, seenBe := map[uint32]bool{}, map[uint32]bool{}
	for i, in := range st.Services {
		svc, verr := normalizeService(in, s.opts.Limits)
		if verr != nil {
			return fmt.Errorf("services[%d]: %v", i, verr)
		}
		if _, dup := s.services[svc.Name]; dup {
			return fmt.Errorf("services[%d]: duplicate name %q", i, svc.Name)
		}
		fk := frontendOf(svc)
		if other, dup := s.frontends[fk]; dup {
			return fmt.Errorf("services[%d]: frontend %s also used by %q", i, fk, other)
		}
		if in.Id == 0 || seenSvc[in.Id] {
			return fmt.Errorf("services[%d]: missing or duplicate id %d", i, in.Id)
		}
		seenSvc[in.Id] = true
		svc.Id, svc.Revision = in.Id, in.Revision
		svcIDs = append(svcIDs, in.Id)
		ids := map[netip.AddrPort]uint32{}
		for _, b := range in.Backends {
			a, err := netip.ParseAddr(b.Address)
			if err != nil {
				return fmt.Errorf("services[%d]: backend %q: %v", i, b.Address, err)
			}
			ids[netip.AddrPortFrom(a, uint16(b.Port))] = b.Id
		}
		for _, b := range svc.Backends {
			id := ids[backendKey(b)]
			if id == 0 || seenBe[id] {
				return fmt.Errorf("services[%d]: backend %s: missing or duplicate id %d", i, backendKey(b), id)
			}
			seenBe[id] = true
			b.Id = id
			beIDs = append(beIDs, id)
		}
		s.services[svc.Name] = svc
		s.frontends[fk] = svc.Name
	}
	for i, in := range st.BgpPeers {
		p, verr := normalizePeer(in)
		if verr != nil {
			return fmt.Errorf("bgp_peers[%d]: %v", i, verr)
		}
		if _, dup := s.peers[p.Address]; dup {
			return fmt.Errorf("bgp_peers[%d]: duplicate peer %s", i, p.Address)
		}
		s.peers[p.Address] = p
	}
	s.drained = st.NodeDrained
	s.svcIDs, s.beIDs = newIDAlloc(svcIDs), newIDAlloc(beIDs)
	return nil
}

// SnapshotAndListen returns the current services and registers l for every change after
// them, with no change lost or seen twice in between. The returned function unregisters l.
func (s *Store) SnapshotAndListen(l Listener) ([]*lbdv1.Service, func()) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	id := s.nextLID
	s.nextLID++
	s.listeners[id] = l
	s.mu.Unlock()
	snap := s.ListServices("")
	return snap, func() {
		s.writeMu.Lock()
		defer s.writeMu.Unlock()
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.listeners, id)
	}
}

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
	t.svcIDs.commit()
	t.beIDs.commit()
	for i, ev := range t.events {
		if ev.Type == Node {
			continue
		}
		if ev.Type == Deleted {
			delete(s.status, ev.Name)
			continue
		}
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

// CreateService adds a service.
func (s *Store) CreateService(in *lbdv1.Service) (*lbdv1.Service, error) {
	svc, verr := normalizeService(in, s.opts.Limits)
	if verr != nil {
		return nil, verr
	}
	t := s.begin()
	if _, ok := t.services[svc.Name]; ok {
		t.abort()
		return nil, alreadyExists("service.name", "service %q already exists", svc.Name)
	}
	if err := t.checkFrontend(svc); err != nil {
		t.abort()
		return nil, err
	}
	if len(t.services) >= s.opts.Limits.MaxServices {
		t.abort()
		return nil, failedPrecondition("", "the limit of %d services is reached", s.opts.Limits.MaxServices)
	}
	t.put(svc, nil)
	if err := t.commit(); err != nil {
		return nil, err
	}
	return s.GetService(svc.Name)
}

// GetService returns a copy of a service with its status.
func (s *Store) GetService(name string) (*lbdv1.Service, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	svc, ok := s.services[name]
	if !ok {
		return nil, notFound("service %q not found", name)
	}
	return s.withStatus(svc), nil
}

// ListServices returns copies of all services (of owner, if non-empty) sorted by name.
func (s *Store) ListServices(owner string) []*lbdv1.Service {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*lbdv1.Service, 0, len(s.services))
	for _, svc := range s.services {
		if owner == "" || svc.Owner == owner {
			out = append(out, s.withStatus(svc))
		}
	}
	slices.SortFunc(out, func(a, b *lbdv1.Service) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// UpdateService replaces a service's spec. The owner cannot change; expectedRevision, if
// non-zero, must match the stored revision.
func (s *Store) UpdateService(in *lbdv1.Service, expectedRevision uint64) (*lbdv1.Service, error) {
	svc, verr := normalizeService(in, s.opts.Limits)
	if verr != nil {
		return nil, verr
	}
	t := s.begin()
	old, ok := t.services[svc.Name]
	switch {
	case !ok:
		t.abort()
		return nil, notFound("service %q not found", svc.Name)
	case expectedRevision != 0 && expectedRevision != old.Revision:
		t.abort()
		return nil, failedPrecondition("expected_revision", "service %q is at revision %d, not %d: it changed since it was read", svc.Name, old.Revision, expectedRevision)
	case svc.Owner != old.Owner:
		t.abort()
		return nil, failedPrecondition("service.owner", "service %q is owned by %q; the owner cannot be changed to %q", svc.Name, old.Owner, svc.Owner)
	}
	if err := t.checkFrontend(svc); err != nil {
		t.abort()
		return nil, err
	}
	if sameSpec(svc, old) {
		t.abort()
		return s.GetService(svc.Name)
	}
	t.put(svc, old)
	if err := t.commit(); err != nil {
		return nil, err
	}
	return s.GetService(svc.Name)
}

// DeleteService removes a service.
func (s *Store) DeleteService(name string) error {
	t := s.begin()
	old, ok := t.services[name]
	if !ok {
		t.abort()
		return notFound("service %q not found", name)
	}
	t.remove(old)
	return t.commit()
}

// ApplyResult counts what ApplyServices did.
type ApplyResult struct {
	Created, Updated, Deleted, Unchanged int
}

// ApplyServices makes the services of owner exactly svcs, all or nothing. Services of
// other owners are never touched; a name or frontend they use is a conflict.
func (s *Store) ApplyServices(owner string, svcs []*lbdv1.Service) (ApplyResult, error) {
	var res ApplyResult
	if err := validateName("owner", owner); err != nil {
		return res, err
	}
	want := make([]*lbdv1.Service, 0, len(svcs))
	names := make(map[string]int, len(svcs))
	fronts := make(map[frontendKey]int, len(svcs))
	for i, in := range svcs {
		if in != nil && in.Owner != "" && in.Owner != owner {
			return res, invalid(fmt.Sprintf("services[%d].owner", i), "%q differs from the applying owner %q", in.Owner, owner)
		}
		svc, verr := normalizeService(in, s.opts.Limits)
		if verr != nil {
			verr.Field = fmt.Sprintf("services[%d]", i) + verr.Field[len("service"):]
			return res, verr
		}
		svc.Owner = owner
		if j, dup := names[svc.Name]; dup {
			return res, invalid(fmt.Sprintf("services[%d].name", i), "duplicate name %q (also services[%d])", svc.Name, j)
		}
		names[svc.Name] = i
		fk := frontendOf(svc)
		if j, dup := fronts[fk]; dup {
			return res, invalid(fmt.Sprintf("services[%d].vip", i), "duplicate frontend %s (also services[%d])", fk, j)
		}
		fronts[fk] = i
		want = append(want, svc)
	}
	t := s.begin()
	for i, svc := range want {
		if old, ok := t.services[svc.Name]; ok && old.Owner != owner {
			t.abort()
			return res, failedPrecondition(fmt.Sprintf("services[%d].name", i), "service %q is owned by %q, not %q", svc.Name, old.Owner, owner)
		}
		if other, ok := t.frontends[frontendOf(svc)]; ok && t.services[other].Owner != owner {
			t.abort()
			return res, alreadyExists(fmt.Sprintf("services[%d].vip", i), "frontend %s is already used by service %q of owner %q", frontendOf(svc), other, t.services[other].Owner)
		}
	}
	// Deletions first, so a frontend may move from one of the owner's services to another.
	for _, name := range slices.Sorted(maps.Keys(t.services)) {
		old := t.services[name]
		if _, keep := names[name]; old.Owner == owner && !keep {
			t.remove(old)
			res.Deleted++
		}
	}
	changed := make([]bool, len(want))
	for i, svc := range want {
		old := t.services[svc.Name]
		if old != nil && sameSpec(svc, old) {
			res.Unchanged++
			continue
		}
		changed[i] = true
		if old != nil {
			delete(t.frontends, frontendOf(old))
		}
	}
	for i, svc := range want {
		if !changed[i] {
			continue
		}
		old := t.services[svc.Name]
		if other, ok := t.frontends[frontendOf(svc)]; ok && other != svc.Name {
			t.abort()
			return ApplyResult{}, alreadyExists("services.vip", "frontend %s is already used by service %q", frontendOf(svc), other)
		}
		t.put(svc, old)
		if old == nil {
			res.Created++
		} else {
			res.Updated++
		}
	}
	if len(t.services) > s.opts.Limits.MaxServices {
		t.abort()
		return ApplyResult{}, failedPrecondition("services", "%d services would exceed the limit of %d", len(t.services), s.opts.Limits.MaxServices)
	}
	if len(t.events) == 0 {
		t.abort()
		return res, nil
	}
	if err := t.commit(); err != nil {
		return ApplyResult{}, err
	}
	return res, nil
}

// editBackends runs edit on a copy of a service's backends and stores the result.
func (s *Store) editBackends(serviceName string, edit func(svc *lbdv1.Service) error) (*lbdv1.Service, error) {
	t := s.begin()
	old, ok := t.services[serviceName]
	if !ok {
		t.abort()
		return nil, notFound("service %q not found", serviceName)
	}
	svc := proto.Clone(old).(*lbdv1.Service)
	if err := edit(svc); err != nil {
		t.abort()
		return nil, err
	}
	if len(svc.Backends) > s.opts.Limits.MaxBackendsPerService {
		t.abort()
		return nil, failedPrecondition("backend", "service %q would have %d backends, over the limit of %d", serviceName, len(svc.Backends), s.opts.Limits.MaxBackendsPerService)
	}
	var weights uint32
	for _, b := range svc.Backends {
		weights += b.Weight
	}
	if weights > svc.MaglevTableSize {
		t.abort()
		return nil, invalid("backend.weight", "weights would add up to %d, more than the Maglev table size %d", weights, svc.MaglevTableSize)
	}
	sortBackends(svc.Backends)
	if sameSpec(svc, old) {
		t.abort()
		return s.GetService(serviceName)
	}
	t.put(svc, old)
	if err := t.commit(); err != nil {
		return nil, err
	}
	return s.GetService(serviceName)
}

func findBackend(svc *lbdv1.Service, k netip.AddrPort) int {
	return slices.IndexFunc(svc.Backends, func(b *lbdv1.Backend) bool { return backendKey(b) == k })
}

func parseBackendRef(address string, port uint32) (netip.AddrPort, error) {
	a, err := netip.ParseAddr(address)
	if err != nil {
		return netip.AddrPort{}, invalid("address", "%q is not an IP address", address)
	}
	if port > 65535 {
		return netip.AddrPort{}, invalid("port", "%d is not a port (0-65535)", port)
	}
	return netip.AddrPortFrom(a.WithZone(""), uint16(port)), nil
}

// CreateBackend adds a backend to a service.
func (s *Store) CreateBackend(serviceName string, in *lbdv1.Backend) (*lbdv1.Backend, error) {
	var key netip.AddrPort
	svc, err := s.editBackends(serviceName, func(svc *lbdv1.Service) error {
		b, verr := normalizeBackend("backend", in, netip.MustParseAddr(svc.Vip), svc.Port)
		if verr != nil {
			return verr
		}
		key = backendKey(b)
		if findBackend(svc, key) >= 0 {
			return alreadyExists("backend.address", "backend %s already exists in service %q", key, serviceName)
		}
		svc.Backends = append(svc.Backends, b)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return svc.Backends[findBackend(svc, key)], nil
}

// GetBackend returns one backend of a service.
func (s *Store) GetBackend(serviceName, address string, port uint32) (*lbdv1.Backend, error) {
	key, err := parseBackendRef(address, port)
	if err != nil {
		return nil, err
	}
	svc, err := s.GetService(serviceName)
	if err != nil {
		return nil, err
	}
	i := findBackend(svc, key)
	if i < 0 {
		return nil, notFound("backend %s not found in service %q", key, serviceName)
	}
	return svc.Backends[i], nil
}

// UpdateBackend replaces a backend's node address, weight and state.
func (s *Store) UpdateBackend(serviceName string, in *lbdv1.Backend) (*lbdv1.Backend, error) {
	return s.UpdateBackendFields(serviceName, in, BackendUpdate{})
}

// BackendUpdate says what UpdateBackendFields replaces, and on which conditions.
type BackendUpdate struct {
	// Fields are the fields replaced: node_address, weight, state; none: all three.
	Fields []string
	// FromStates, if not empty, are the states the backend must be in.
	FromStates []lbdv1.BackendState
}

// UpdateBackendFields replaces the fields u names of a backend, keeping the others as
// stored, if the backend is in one of u.FromStates (when given); the state is checked
// and the change made in one transaction.
func (s *Store) UpdateBackendFields(serviceName string, in *lbdv1.Backend, u BackendUpdate) (*lbdv1.Backend, error) {
	if in == nil {
		return nil, invalid("backend", "is required")
	}
	fields := u.Fields
	for _, f := range fields {
		if !slices.Contains(updatableBackendFields, f) {
			return nil, invalid("update_mask", "%q is not one of %s", f, strings.Join(updatableBackendFields, ", "))
		}
	}
	key, err := parseBackendRef(in.Address, in.Port)
	if err != nil {
		return nil, err
	}
	svc, err := s.editBackends(serviceName, func(svc *lbdv1.Service) error {
		i := findBackend(svc, key)
		if i < 0 {
			return notFound("backend %s not found in service %q", key, serviceName)
		}
		if st := svc.Backends[i].State; len(u.FromStates) > 0 && !slices.Contains(u.FromStates, st) {
			return failedPrecondition("only_from_states", "backend %s of service %q is %s, not one of %v", key, serviceName, st, u.FromStates)
		}
		merged := in
		if len(fields) > 0 {
			// Only the named fields come from in; the rest stay as stored.
			merged = proto.Clone(svc.Backends[i]).(*lbdv1.Backend)
			for _, f := range fields {
				switch f {
				case "node_address":
					merged.NodeAddress = in.NodeAddress
				case "weight":
					merged.Weight = in.Weight
				case "state":
					merged.State = in.State
				}
			}
		}
		b, verr := normalizeBackend("backend", merged, netip.MustParseAddr(svc.Vip), svc.Port)
		if verr != nil {
			return verr
		}
		svc.Backends[i] = b
		return nil
	})
	if err != nil {
		return nil, err
	}
	return svc.Backends[findBackend(svc, key)], nil
}

// updatableBackendFields are the fields UpdateBackend may be asked to replace alone.
var updatableBackendFields = []string{"node_address", "weight", "state"}

// DeleteBackend removes a backend from a service.
func (s *Store) DeleteBackend(serviceName, address string, port uint32) error {
	key, err := parseBackendRef(address, port)
	if err != nil {
		return err
	}
	_, err = s.editBackends(serviceName, func(svc *lbdv1.Service) error {
		i := findBackend(svc, key)
		if i < 0 {
			return notFound("backend %s not found in service %q", key, serviceName)
		}
		svc.Backends = slices.Delete(svc.Backends, i, i+1)
		return nil
	})
	return err
}

// CreateBgpPeer adds a BGP peer.
func (s *Store) CreateBgpPeer(in *lbdv1.BgpPeer) (*lbdv1.BgpPeer, error) {
	p, verr := normalizePeer(in)
	if verr != nil {
		return nil, verr
	}
	t := s.begin()
	if _, ok := t.peers[p.Address]; ok {
		t.abort()
		return nil, alreadyExists("peer.address", "peer %s already exists", p.Address)
	}
	if len(t.peers) >= s.opts.Limits.MaxBgpPeers {
		t.abort()
		return nil, failedPrecondition("", "the limit of %d BGP peers is reached", s.opts.Limits.MaxBgpPeers)
	}
	t.peers[p.Address] = p
	t.events = append(t.events, Event{Type: Node})
	if err := t.commit(); err != nil {
		return nil, err
	}
	return publicPeer(p), nil
}

// UpdateBgpPeer replaces a peer's configuration.
func (s *Store) UpdateBgpPeer(in *lbdv1.BgpPeer) (*lbdv1.BgpPeer, error) {
	p, verr := normalizePeer(in)
	if verr != nil {
		return nil, verr
	}
	t := s.begin()
	if _, ok := t.peers[p.Address]; !ok {
		t.abort()
		return nil, notFound("peer %s not found", p.Address)
	}
	t.peers[p.Address] = p
	t.events = append(t.events, Event{Type: Node})
	if err := t.commit(); err != nil {
		return nil, err
	}
	return publicPeer(p), nil
}

// DeleteBgpPeer removes a peer.
func (s *Store) DeleteBgpPeer(address string) error {
	a, err := netip.ParseAddr(address)
	if err != nil {
		return invalid("address", "%q is not an IP address", address)
	}
	t := s.begin()
	if _, ok := t.peers[a.Unmap().String()]; !ok {
		t.abort()
		return notFound("peer %s not found", address)
	}
	delete(t.peers, a.Unmap().String())
	t.events = append(t.events, Event{Type: Node})
	return t.commit()
}

// GetBgpPeer returns one peer, without its password.
func (s *Store) GetBgpPeer(address string) (*lbdv1.BgpPeer, error) {
	a, err := netip.ParseAddr(address)
	if err != nil {
		return nil, invalid("address", "%q is not an IP address", address)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	p, ok := s.peers[a.Unmap().String()]
	if !ok {
		return nil, notFound("peer %s not found", address)
	}
	return publicPeer(p), nil
}

// ListBgpPeers returns all peers sorted by address, without passwords.
func (s *Store) ListBgpPeers() []*lbdv1.BgpPeer {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*lbdv1.BgpPeer, 0, len(s.peers))
	for _, p := range s.peers {
		out = append(out, publicPeer(p))
	}
	slices.SortFunc(out, func(a, b *lbdv1.BgpPeer) int {
		return netip.MustParseAddr(a.Address).Compare(netip.MustParseAddr(b.Address))
	})
	return out
}

// BgpPeersWithSecrets returns all peers including passwords, for the BGP speaker.
func (s *Store) BgpPeersWithSecrets() []*lbdv1.BgpPeer {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*lbdv1.BgpPeer, 0, len(s.peers))
	for _, p := range s.peers {
		out = append(out, proto.Clone(p).(*lbdv1.BgpPeer))
	}
	return out
}

func publicPeer(p *lbdv1.BgpPeer) *lbdv1.BgpPeer {
	c := proto.Clone(p).(*lbdv1.BgpPeer)
	c.Password = ""
	return c
}

// SetDrained sets the node's drain flag.
func (s *Store) SetDrained(drained bool) error {
	t := s.begin()
	if t.drained == drained {
		t.abort()
		return nil
	}
	t.drained = drained
	t.events = append(t.events, Event{Type: Node})
	return t.commit()
}

// Drained reports the node's drain flag.
func (s *Store) Drained() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.drained
}

// Counts returns the number of services and backends.
func (s *Store) Counts() (services, backends int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, svc := range s.services {
		backends += len(svc.Backends)
	}
	return len(s.services), backends
}

// ErrStaleRevision is returned by ReportDatapath for a revision that is no longer current.
var ErrStaleRevision = errors.New("stale revision")
