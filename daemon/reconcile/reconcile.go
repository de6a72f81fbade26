// Package reconcile drives the datapath toward the desired state. The store pushes every
// change to the reconciler; the reconciler coalesces changes per service and hands them to
// the Datapath, which is the only writer of BPF maps. Nothing is polled.
package reconcile

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// Datapath programs services. Services handed to it are normalized by the store and carry
// stable IDs (Service.id, Backend.id) and each backend's state and health.
type Datapath interface {
	// Sync makes the datapath hold exactly these services, removing any others (at start,
	// when the datapath may hold state from an earlier run). It returns each service's
	// Maglev table share per backend ID, keyed by service name.
	Sync(ctx context.Context, services []*lbdv1.Service) (map[string]map[uint32]uint32, error)
	// Upsert programs one service, replacing what the datapath holds for its ID. It
	// returns the Maglev table share per backend ID.
	Upsert(ctx context.Context, svc *lbdv1.Service) (map[uint32]uint32, error)
	// Delete removes one service (by its ID) and its backends.
	Delete(ctx context.Context, svc *lbdv1.Service) error
}

// Reconciler applies store changes to a Datapath.
type Reconciler struct {
	st  *store.Store
	dp  Datapath
	log hclog.Logger

	mu      sync.Mutex
	pending map[string]store.Event // latest change per service name
	lastSeq uint64                 // Seq of the last event enqueued
	wake    chan struct{}

	applied map[string]*lbdv1.Service // what the datapath holds, by name; run goroutine only
	// failed holds the Seq of each service whose last change the datapath refused: IDs
	// that change released stay held (store.Reconciled) until it is applied.
	failed map[string]uint64
	// Observe, when set, is called after each service is applied with how long it took
	// from the change to the datapath (for metrics).
	Observe func(time.Duration)
}

// New returns a reconciler; Run starts it.
func New(st *store.Store, dp Datapath, log hclog.Logger) *Reconciler {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Reconciler{st: st, dp: dp, log: log, pending: map[string]store.Event{}, wake: make(chan struct{}, 1),
		applied: map[string]*lbdv1.Service{}, failed: map[string]uint64{}}
}

// Run syncs the datapath with the store, then applies changes until ctx ends.
func (r *Reconciler) Run(ctx context.Context) error {
	snap, seq, cancel := r.st.SnapshotAndListen(r.enqueue)
	defer cancel()
	slots, err := r.dp.Sync(ctx, snap)
	if err != nil {
		for _, svc := range snap {
			r.report(svc, seq, err, nil)
		}
		return fmt.Errorf("initial datapath sync: %w", err)
	}
	for _, svc := range snap {
		r.applied[svc.Name] = svc
		r.report(svc, seq, nil, slots[svc.Name])
	}
	r.st.Reconciled(seq)
	r.log.Info("datapath synced", "op", "reconcile", "services", len(snap))
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.wake:
		}
		r.mu.Lock()
		batch, upTo := r.pending, r.lastSeq
		r.pending = map[string]store.Event{}
		r.mu.Unlock()
		for _, name := range slices.Sorted(maps.Keys(batch)) {
			ev := batch[name]
			if err := r.apply(ctx, ev); err != nil {
				r.failed[name] = ev.Seq
			} else {
				delete(r.failed, name)
			}
		}
		for _, s := range r.failed {
			upTo = min(upTo, s-1)
		}
		r.st.Reconciled(upTo)
	}
}

// enqueue is the store listener: it only records and signals, never blocks.
func (r *Reconciler) enqueue(evs []store.Event) {
	r.mu.Lock()
	for _, ev := range evs {
		if !ev.StatusOnly && ev.Type != store.Node {
			r.pending[ev.Name] = ev
		}
		r.lastSeq = max(r.lastSeq, ev.Seq)
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *Reconciler) apply(ctx context.Context, ev store.Event) error {
	start := time.Now()
	old := r.applied[ev.Name]
	if old != nil && (ev.Type == store.Deleted || old.Id != ev.Service.Id) {
		if err := r.dp.Delete(ctx, old); err != nil {
			r.log.Error("datapath delete failed", "op", "reconcile", "service", ev.Name, "error", err)
			if ev.Type != store.Deleted {
				r.report(ev.Service, ev.Seq, err, nil)
			}
			return err
		}
		delete(r.applied, ev.Name)
	}
	if ev.Type == store.Deleted {
		r.observe(start)
		return nil
	}
	slots, err := r.dp.Upsert(ctx, ev.Service)
	if err != nil {
		r.log.Error("datapath update failed", "op", "reconcile", "service", ev.Name, "revision", ev.Service.Revision, "error", err)
	} else {
		r.applied[ev.Name] = ev.Service
	}
	r.report(ev.Service, ev.Seq, err, slots)
	r.observe(start)
	return err
}

func (r *Reconciler) observe(start time.Time) {
	if r.Observe != nil {
		r.Observe(time.Since(start))
	}
}

func (r *Reconciler) report(svc *lbdv1.Service, seq uint64, err error, slots map[uint32]uint32) {
	if rerr := r.st.ReportDatapath(svc.Name, svc.Revision, seq, err, slots); rerr != nil && rerr != store.ErrStaleRevision {
		r.log.Warn("cannot report datapath result", "op", "reconcile", "service", svc.Name, "error", rerr)
	}
}
