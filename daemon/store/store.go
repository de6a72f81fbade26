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
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/lock"
	"github.com/lbd-dev/lbd/daemon/model"
	statev1 "github.com/lbd-dev/lbd/proto/lbd/state/v1"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
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
	// Service is the service after the change, or before it for Deleted, with its
	// addresses parsed. Listeners must not modify it.
	Service *model.Service
	// StatusOnly is set when only the datapath's own report changed the service (its
	// output-only status): the reconciler ignores those. Health changes are not
	// StatusOnly, since they change which backends take new flows.
	StatusOnly bool
	// Seq orders every batch of events the store emits (and its snapshots): the
	// reconciler reports which Seq the datapath applied (ReportDatapath, Reconciled).
	Seq uint64
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
	// Shared, when set, is the fleet's store that every change of services is written
	// to first (shared.go); the state file is then this node's copy.
	Shared Shared
	// HoldIDs keeps the IDs of removed services and backends from being handed out
	// again until Reconciled says the datapath applied their removal: conntrack entries
	// and pending datapath operations refer to IDs, and a new owner must never meet
	// them. Set it when a reconciler runs; without one, IDs are free at once.
	HoldIDs bool
	// Memory, when set, bounds the kernel memory the services' Maglev tables would take
	// in the datapath: a change beyond it is refused with RESOURCE_EXHAUSTED, before any
	// map is created. It is asked at every change (the datapath measures its other maps
	// once they are loaded).
	Memory func() MemoryBudget
}

// MemoryBudget is what the services' Maglev tables may take of the node's BPF memory.
type MemoryBudget struct {
	// Tables is the memory left for them; Total the node's budget and Setting its name,
	// for the error.
	Tables, Total uint64
	Setting       string
	// TableBytes is the kernel memory of a service's table. It must not change once
	// given: the store keeps the total up to date change by change.
	TableBytes func(svc *lbdv1.Service) uint64
	// Unknown, when set, says why the budget is not known yet: a change that would add
	// table memory is refused with UNAVAILABLE and this reason; others go through.
	Unknown string
}

// Store is the desired-state store. It is safe for concurrent use.
type Store struct {
	opts Options
	log  hclog.Logger
	lock *lock.Held

	writeMu sync.Mutex // serializes transactions, held while the state file is written

	disk *disk // nil for a store in memory

	mu       sync.RWMutex // guards the published state below
	services map[string]*model.Service
	// names are the services' names in order: lists and pages walk it.
	names     []string
	frontends map[frontendKey]string
	peers     map[netip.Addr]*lbdv1.BgpPeer // by address
	drained   bool
	// backends counts the backends of all services, and tableBytes the kernel memory of
	// their tables as MemoryBudget.TableBytes gives it (once tableBytesKnown), so that
	// limits are checked without walking every service.
	backends        int
	tableBytes      uint64
	tableBytesKnown bool
	svcIDs          idAlloc
	beIDs           idAlloc
	reconciled      chan struct{} // closed and replaced at each Reconciled
	status          map[string]*serviceRuntime
	nodes           map[netip.Addr]NodeReach // what this LB node knows of each backend node's reachability
	// byNode holds, for each backend node, the services with backends on it (and how
	// many), so that a node's change touches only those.
	byNode    map[netip.Addr]map[string]int
	seq       uint64 // Seq of the last batch of events
	listeners map[int]Listener
	nextLID   int
}

// serviceRuntime is output-only information about a service, reported by the reconciler
// and the health checker; it is not persisted.
type serviceRuntime struct {
	appliedRevision uint64
	// wantSeq is the Seq of the last event the datapath must apply for the service (a
	// spec change, or a change of which backends are usable); appliedSeq the last one
	// it reported. The service is PENDING while they differ.
	wantSeq, appliedSeq uint64
	datapathErr         string
	tableSlots          map[uint32]uint32
	health              map[uint32]*lbdv1.BackendHealth
	updated             time.Time
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
		opts:       opts,
		log:        opts.Logger,
		services:   map[string]*model.Service{},
		frontends:  map[frontendKey]string{},
		peers:      map[netip.Addr]*lbdv1.BgpPeer{},
		byNode:     map[netip.Addr]map[string]int{},
		status:     map[string]*serviceRuntime{},
		listeners:  map[int]Listener{},
		reconciled: make(chan struct{}),
	}
	if s.log == nil {
		s.log = hclog.NewNullLogger()
	}
	var st *statev1.State
	var j *journal
	if opts.Path != "" {
		if err := s.lockDir(); err != nil {
			return nil, err
		}
		var err error
		if s.disk, st, j, err = loadDisk(opts.Path, s.log, &s.writeMu); err != nil {
			s.Close()
			return nil, err
		}
	}
	if err := s.restore(st); err != nil {
		s.disk = nil // the files stay as they are
		s.Close()
		return nil, fmt.Errorf("%s: %w: %v", opts.Path, ErrCorruptState, err)
	}
	if s.disk != nil {
		if err := s.disk.start(j); err != nil {
			s.disk = nil
			s.Close()
			return nil, fmt.Errorf("%s: %w", opts.Path, err)
		}
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
	l, err := lock.Acquire(s.opts.Path+".lock", "state file "+s.opts.Path)
	if err != nil {
		return err
	}
	s.lock = l
	return nil
}

// Close writes the whole state to the state file (so that it alone holds it), refuses
// further changes and releases the state file lock.
func (s *Store) Close() error {
	var err error
	if s.disk != nil {
		if err = s.disk.close(s.snapshot); err != nil {
			s.log.Error("state snapshot not written at close; the journal keeps every change", "op", "persist", "error", err)
		}
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if s.lock == nil {
		return err
	}
	err = errors.Join(err, s.lock.Release())
	s.lock = nil
	return err
}

// restore loads a decoded state, checking it as strictly as API input: a file that lbd
// itself could not have written is not trusted.
func (s *Store) restore(st *statev1.State) error {
	if st == nil {
		st = &statev1.State{}
	}
	var svcIDs, beIDs []uint32
	seenSvc, seenBe := map[uint32]bool{}, map[uint32]bool{}
	for i, in := range st.Services {
		svc, verr := normalizeStored(in, s.opts.Limits)
		if verr != nil {
			return fmt.Errorf("services[%d]: %v", i, verr)
		}
		name := svc.Spec.Name
		if _, dup := s.services[name]; dup {
			return fmt.Errorf("services[%d]: duplicate name %q", i, name)
		}
		fk := frontendOf(svc)
		if other, dup := s.frontends[fk]; dup {
			return fmt.Errorf("services[%d]: frontend %s also used by %q", i, fk, other)
		}
		if id := svc.Spec.Id; id == 0 || seenSvc[id] {
			return fmt.Errorf("services[%d]: missing or duplicate id %d", i, id)
		}
		seenSvc[svc.Spec.Id] = true
		svcIDs = append(svcIDs, svc.Spec.Id)
		for j, b := range svc.Spec.Backends {
			if b.Id == 0 || seenBe[b.Id] {
				return fmt.Errorf("services[%d]: backend %s: missing or duplicate id %d", i, svc.Backends[j].Addr, b.Id)
			}
			seenBe[b.Id] = true
			beIDs = append(beIDs, b.Id)
		}
		s.services[name] = svc
		s.frontends[fk] = name
		s.names = append(s.names, name)
		s.indexNodes(svc, 1)
		s.backends += len(svc.Backends)
	}
	slices.Sort(s.names)
	for i, in := range st.BgpPeers {
		p, addr, verr := normalizePeer(in)
		if verr != nil {
			return fmt.Errorf("bgp_peers[%d]: %v", i, verr)
		}
		if _, dup := s.peers[addr]; dup {
			return fmt.Errorf("bgp_peers[%d]: duplicate peer %s", i, addr)
		}
		s.peers[addr] = p
	}
	s.drained = st.NodeDrained
	s.svcIDs = newIDAlloc(svcIDs, s.opts.HoldIDs, uint32(s.opts.Limits.MaxServices))
	s.beIDs = newIDAlloc(beIDs, s.opts.HoldIDs, uint32(s.opts.Limits.MaxBackends))
	return nil
}

// SnapshotAndListen returns the current services, the Seq they reflect, and registers l
// for every change after them, with no change lost or seen twice in between. The
// returned function unregisters l.
func (s *Store) SnapshotAndListen(l Listener) ([]*model.Service, uint64, func()) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	id := s.nextLID
	s.nextLID++
	s.listeners[id] = l
	seq := s.seq
	snap := make([]*model.Service, 0, len(s.names))
	for _, name := range s.names {
		snap = append(snap, s.typedWithStatus(s.services[name]))
	}
	s.mu.Unlock()
	return snap, seq, func() {
		s.writeMu.Lock()
		defer s.writeMu.Unlock()
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.listeners, id)
	}
}

// Seq returns the sequence of the last change the store published: the audit trail
// records it after each change.
func (s *Store) Seq() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.seq
}

// Counts returns the number of services and backends.
func (s *Store) Counts() (services, backends int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.services), s.backends
}
