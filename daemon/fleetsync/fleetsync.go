// Package fleetsync keeps a node's desired state in step with its fleet's services in
// etcd (daemon/etcdstore): at start and after every reconnection it reads the fleet's
// services (all of them, or the changes since the revision it holds), then follows the
// watch; every change made through this node's API is written to etcd first, by
// compare-and-swap on the revision its state reflects. The node's own store (the state
// file) keeps a copy: a node started while etcd is down serves, and programs, its last
// view of the fleet.
//
// A node that cannot reach etcd keeps its datapath as it is, answers reads with their
// staleness stated and refuses writes with UNAVAILABLE.
package fleetsync

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/etcdstore"
	"github.com/lbd-dev/lbd/daemon/store"
	statev1 "github.com/lbd-dev/lbd/proto/lbd/state/v1"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// probeInterval is how often the connection to etcd is checked: a node notices within
// about this long (plus the client's timeout) that it lost etcd, or that it is back.
const probeInterval = time.Second

// heldWait bounds how long a change of the watch waits for this node's datapath to
// release IDs the change reuses.
const heldWait = 10 * time.Second

// ErrSeedMismatch: this node's hash seed is not the fleet's; its tables would differ.
var ErrSeedMismatch = errors.New("datapath.hash_seed differs from the fleet's")

// Options configure a Sync.
type Options struct {
	Client *etcdstore.Client
	// HashSeed is this node's datapath.hash_seed: the first node of a fleet writes it
	// into the fleet's head, and every node must have the same.
	HashSeed uint32
	Logger   hclog.Logger
}

// Sync follows the fleet's services for one node. It implements store.Shared.
type Sync struct {
	cli  *etcdstore.Client
	st   *store.Store
	seed uint32
	log  hclog.Logger

	// headRev is the head revision the store's services reflect (0: none yet). It is
	// read and written only under the store's write lock (inside Commit and the
	// callbacks of ApplyShared), which orders this node's own commits with the
	// changes the watch brings.
	headRev int64

	mu      sync.Mutex
	synced  bool      // the store reflects the fleet at headRev as read since start
	up      bool      // the last probe reached etcd
	downAt  time.Time // when it was first missed
	lastErr error
	rev     int64 // copy of headRev for readers
	// reconnected is signalled when a probe succeeds after a failure: the watch is
	// restarted from the revision held, whatever it did meanwhile.
	reconnected chan struct{}

	view nodesView
}

// New prepares a Sync; the store it is the Shared of is given to Run.
func New(o Options) *Sync {
	log := o.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Sync{cli: o.Client, seed: o.HashSeed, log: log, reconnected: make(chan struct{}, 1)}
}

// Commit implements store.Shared: it writes a change of this node's API to the fleet,
// if the fleet is still at the revision the store reflects. The store holds its write
// lock.
func (s *Sync) Commit(ctx context.Context, puts []*lbdv1.Service, deletes []string) error {
	s.mu.Lock()
	synced, up, since, lastErr := s.synced, s.up, s.downAt, s.lastErr
	s.mu.Unlock()
	if !synced {
		return fmt.Errorf("%w: this node has not read the fleet's services since it started (%s); it serves its local copy and takes no change until it has", store.ErrSharedUnavailable, errText(lastErr))
	}
	if !up {
		return fmt.Errorf("%w since %s (%s): the change was not made", store.ErrSharedUnavailable, since.UTC().Format(time.RFC3339), errText(lastErr))
	}
	rev, err := s.cli.Commit(ctx, s.headRev, &statev1.FleetHead{HashSeed: s.seed}, puts, deletes)
	switch {
	case errors.Is(err, etcdstore.ErrConflict):
		return fmt.Errorf("%w: another node's change came after revision %d, which this node's view reflects; nothing was written: retry", store.ErrSharedConflict, s.headRev)
	case errors.Is(err, etcdstore.ErrUnavailable):
		s.probeFailed(err)
		return fmt.Errorf("%w (%v): the change may or may not have been made; this node's view follows once etcd answers", store.ErrSharedUnavailable, err)
	case err != nil:
		return err
	}
	s.setRev(rev)
	return nil
}

func (s *Sync) setRev(rev int64) {
	s.headRev = rev
	s.mu.Lock()
	s.rev = rev
	s.mu.Unlock()
}

// Stale implements store.Shared: why the services this node serves may be behind the
// fleet's, or "" when it follows etcd.
func (s *Sync) Stale() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case !s.synced:
		return fmt.Sprintf("the fleet's services not yet read from etcd since this node started (%s): this is the node's local copy", errText(s.lastErr))
	case !s.up:
		return fmt.Sprintf("etcd unreachable since %s (%s): the fleet's services as of revision %d", s.downAt.UTC().Format(time.RFC3339), errText(s.lastErr), s.rev)
	}
	return ""
}

// Revision is the head revision this node's services reflect.
func (s *Sync) Revision() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rev
}

func errText(err error) string {
	if err == nil {
		return "first read under way"
	}
	return err.Error()
}

func (s *Sync) probeFailed(err error) {
	if errors.Is(err, etcdstore.ErrNoLeader) {
		// A quorum of members answers and elects a leader: nothing changes in the
		// fleet meanwhile, so this node's services are not behind (they are not
		// stale), and a change through it waits for the leader or fails by itself.
		s.log.Debug("etcd has no leader yet", "op", "fleet", "error", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.up || s.downAt.IsZero() {
		s.downAt = time.Now()
		s.log.Warn("etcd unreachable: the datapath keeps its state, changes are refused", "op", "fleet", "error", err)
	}
	s.up, s.lastErr = false, err
}

func (s *Sync) probeOK() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.up {
		if !s.downAt.IsZero() {
			s.log.Info("etcd reachable again: resyncing", "op", "fleet", "down_for", time.Since(s.downAt).Round(time.Millisecond))
		}
		select {
		case s.reconnected <- struct{}{}:
		default:
		}
	}
	s.up, s.lastErr, s.downAt = true, nil, time.Time{}
}

// Run follows the fleet into st, the store whose Options.Shared s is, until ctx ends.
// It returns an error only for what no retry can fix: this node's hash seed is not the
// fleet's.
func (s *Sync) Run(ctx context.Context, st *store.Store) error {
	s.st = st
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() { s.probe(ctx) })
	for ctx.Err() == nil {
		err := s.follow(ctx)
		if errors.Is(err, ErrSeedMismatch) {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			s.log.Debug("fleet watch ended; resyncing", "op", "fleet", "error", err)
			if errors.Is(err, etcdstore.ErrUnavailable) {
				s.probeFailed(err)
			}
		}
		select {
		case <-ctx.Done():
		case <-s.reconnected:
		case <-time.After(probeInterval):
		}
	}
	return nil
}

// probe checks the connection to etcd every probeInterval: a watch alone says nothing
// while no change comes.
func (s *Sync) probe(ctx context.Context) {
	t := time.NewTicker(probeInterval)
	defer t.Stop()
	for {
		if err := s.cli.Ping(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			s.probeFailed(err)
		} else {
			s.probeOK()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// follow brings the store in line with the fleet, then applies the watch's changes
// until it breaks or etcd comes back after a loss (the watch is then restarted from
// the revision held, so that nothing the client's own retries skipped is missed).
func (s *Sync) follow(ctx context.Context) error {
	s.mu.Lock()
	synced, rev := s.synced, s.rev
	s.mu.Unlock()
	if !synced {
		var err error
		if rev, err = s.resync(ctx); err != nil {
			return err
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-wctx.Done():
		case <-s.reconnected:
			cancel()
		}
	}()
	err := s.cli.Watch(wctx, rev, s.applyChange)
	if errors.Is(err, etcdstore.ErrCompacted) {
		s.log.Info("the revision held was compacted away: reading the whole state again", "op", "fleet", "revision", rev, "error", err)
		s.mu.Lock()
		s.synced = false
		s.mu.Unlock()
	}
	if err == nil && ctx.Err() == nil {
		return errors.New("etcd came back: watching again from the revision held")
	}
	return err
}

// applyChange applies one change of the watch; changes this node wrote itself are
// already in its store.
func (s *Sync) applyChange(ch etcdstore.Change) error {
	// An ID the writer reused may still be held here, until this node's datapath
	// applied its release (store.SharedIDsHeld): the change waits for that, which
	// takes a reconciliation, but not forever.
	for deadline := time.Now().Add(heldWait); s.st.SharedIDsHeld(ch.Puts); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			s.log.Warn("the change reuses IDs this node's datapath has not released yet; applying it anyway", "op", "fleet", "revision", ch.Revision, "waited", heldWait)
			break
		}
	}
	var skipped bool
	err := s.st.ApplyShared(false, ch.Puts, ch.Deletes, func() bool {
		if ch.Revision <= s.headRev {
			skipped = true
			return false
		}
		s.setRev(ch.Revision)
		return true
	})
	if err == nil && !skipped {
		s.log.Debug("fleet change applied", "op", "fleet", "revision", ch.Revision, "puts", len(ch.Puts), "deletes", len(ch.Deletes))
	}
	return err
}

// resync reads the whole fleet and makes it the store's services. A fleet that has
// none yet (no head) gets this node's services: the first node of a fleet brings its
// own, which is how a file-store node moves to etcd.
func (s *Sync) resync(ctx context.Context) (int64, error) {
	for {
		fs, err := s.cli.Load(ctx)
		if err != nil {
			return 0, err
		}
		if fs.HeadRevision == 0 {
			err := s.seedFleet(ctx)
			if errors.Is(err, etcdstore.ErrConflict) {
				continue // another node seeded it first: take its services
			}
			if err != nil {
				return 0, err
			}
			continue
		}
		if fs.Head.GetHashSeed() != s.seed {
			return 0, fmt.Errorf("%w: this node has %d, the fleet under %s has %d (set by its first node): give every LB node of the fleet the same datapath.hash_seed",
				ErrSeedMismatch, s.seed, s.cli.Prefix(), fs.Head.GetHashSeed())
		}
		if err := s.st.ApplyShared(true, fs.Services, nil, func() bool { s.setRev(fs.HeadRevision); return true }); err != nil {
			return 0, fmt.Errorf("apply the fleet's services: %w", err)
		}
		s.mu.Lock()
		first := !s.synced
		s.synced = true
		s.mu.Unlock()
		if first {
			s.log.Info("in step with the fleet", "op", "fleet", "prefix", s.cli.Prefix(), "revision", fs.HeadRevision, "services", len(fs.Services))
		}
		// The watch starts at the read's revision (at or after the head's: node
		// registrations move it too), which a compaction cannot have removed yet.
		return fs.Revision, nil
	}
}

// seedFleet writes this node's services as the first state of an empty fleet.
func (s *Sync) seedFleet(ctx context.Context) error {
	svcs := s.st.ListServices("")
	for i, svc := range svcs {
		svcs[i] = store.SpecOnly(svc)
	}
	rev, err := s.cli.Commit(ctx, 0, &statev1.FleetHead{HashSeed: s.seed}, svcs, nil)
	if err != nil {
		return err
	}
	s.log.Info("the fleet had no services yet: this node's became its first state", "op", "fleet", "prefix", s.cli.Prefix(), "services", len(svcs), "revision", rev)
	return nil
}
