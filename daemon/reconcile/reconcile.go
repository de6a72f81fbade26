// Package reconcile drives the datapath toward the desired state. The store pushes every
// change to the reconciler; the reconciler coalesces changes per service and hands each
// batch of them to the Datapath in one call, so that a burst (10,000 services applied at
// once) costs the datapath one pass rather than one per service. The Datapath is the
// only writer of BPF maps. Nothing is polled.
package reconcile

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/model"
	"github.com/lbd-dev/lbd/daemon/store"
)

// Datapath programs services. Services handed to it are normalized by the store (their
// addresses parsed) and carry stable IDs (Service.id, Backend.id) and each backend's
// state and health.
type Datapath interface {
	// Sync makes the datapath hold exactly these services, removing any others (at start,
	// when the datapath may hold state from an earlier run). It returns each service's
	// Maglev table share per backend ID, keyed by service name.
	Sync(ctx context.Context, services []*model.Service) (map[string]map[uint32]uint32, error)
	// Apply removes the services of deletes (by ID) with their backends, then programs
	// those of upserts, each replacing what the datapath holds for its ID. It returns,
	// by service ID, the Maglev table share per backend ID of each service programmed,
	// and the error of each change that failed; a failed change does not stop the
	// others.
	Apply(ctx context.Context, deletes, upserts []*model.Service) (map[uint32]map[uint32]uint32, map[uint32]error)
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

	applied map[string]*model.Service // what the datapath holds, by name; run goroutine only
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
		applied: map[string]*model.Service{}, failed: map[string]uint64{}}
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
		r.applied[svc.Spec.Name] = svc
		r.report(svc, seq, nil, slots[svc.Spec.Name])
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
		r.apply(ctx, batch)
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

// apply hands a batch of changes to the datapath in one call and reports each
// service's result to the store. A service whose change failed keeps its Seq in failed.
func (r *Reconciler) apply(ctx context.Context, batch map[string]store.Event) {
	if len(batch) == 0 {
		return // a wake-up for status or node events only
	}
	start := time.Now()
	names := slices.Sorted(maps.Keys(batch))
	var deletes, upserts []*model.Service
	for _, name := range names {
		ev := batch[name]
		if old := r.applied[name]; old != nil && (ev.Type == store.Deleted || old.Spec.Id != ev.Service.Spec.Id) {
			deletes = append(deletes, old)
		}
		if ev.Type != store.Deleted {
			upserts = append(upserts, ev.Service)
		}
	}
	slots, errs := r.dp.Apply(ctx, deletes, upserts)
	for _, name := range names {
		ev := batch[name]
		var err error
		if old := r.applied[name]; old != nil && (ev.Type == store.Deleted || old.Spec.Id != ev.Service.Spec.Id) {
			if err = errs[old.Spec.Id]; err != nil {
				r.log.Error("datapath delete failed", "op", "reconcile", "service", name, "error", err)
			} else {
				delete(r.applied, name)
			}
		}
		if ev.Type != store.Deleted {
			if err == nil {
				if err = errs[ev.Service.Spec.Id]; err != nil {
					r.log.Error("datapath update failed", "op", "reconcile", "service", name, "revision", ev.Service.Spec.Revision, "error", err)
				} else {
					r.applied[name] = ev.Service
				}
			}
			r.report(ev.Service, ev.Seq, err, slots[ev.Service.Spec.Id])
		}
		if err != nil {
			r.failed[name] = ev.Seq
		} else {
			delete(r.failed, name)
		}
		r.observe(start)
	}
}

func (r *Reconciler) observe(start time.Time) {
	if r.Observe != nil {
		r.Observe(time.Since(start))
	}
}

func (r *Reconciler) report(svc *model.Service, seq uint64, err error, slots map[uint32]uint32) {
	if rerr := r.st.ReportDatapath(svc.Spec.Name, svc.Spec.Revision, seq, err, slots); rerr != nil && rerr != store.ErrStaleRevision {
		r.log.Warn("cannot report datapath result", "op", "reconcile", "service", svc.Spec.Name, "error", rerr)
	}
}
