// Package healthsync connects the health checker to the desired state: it keeps a
// health.Checker probing every backend of every service that has a health check, and
// writes each health transition into the store. The store then reports the backend as
// down (or up again), which makes the reconciler rebuild the service's Maglev table
// without it (or with it).
//
// Every LB node runs its own healthsync. Nodes do not share results: the same probes of
// the same backends bring every node to the same health and so to the same tables.
//
// Only transitions are written to the store, so the cost of keeping the store current
// follows how often backends change state, not how often they are probed. A backend's
// last_result and last_check_time are therefore those of the probe that caused its last
// transition, not of the latest probe.
package healthsync

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/health"
	"github.com/lbd-dev/lbd/daemon/model"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Options configure Run. The zero value works.
type Options struct {
	// Logger receives one line per health transition (from the checker) and the
	// problems of healthsync itself.
	Logger hclog.Logger
	// MaxInFlight bounds concurrent probes (see health.Options).
	MaxInFlight int
	// RootCAs verifies HTTPS backends (nil: the system roots).
	RootCAs *x509.CertPool
	// Damping configures flap damping (zero value: the health package's defaults).
	Damping health.Damping

	// probeAddr maps a backend's address to the address actually probed. Only tests set
	// it: the store rejects loopback backends, and in-process test servers listen on
	// loopback.
	probeAddr func(netip.AddrPort) netip.AddrPort
}

// Run probes the backends of the store's services until ctx ends, and records their
// health in the store. Only LB nodes should run it: their probes decide which backends
// take new flows.
func Run(ctx context.Context, st *store.Store, o Options) {
	s := newSyncer(st, o)
	defer s.stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
			s.sync()
		}
	}
}

// syncer owns one health.Checker and mirrors the store into it.
type syncer struct {
	st        *store.Store
	log       hclog.Logger
	probeAddr func(netip.AddrPort) netip.AddrPort
	checker   *health.Checker
	unlisten  func()

	pendMu  sync.Mutex
	pending map[string]change // latest change per service name, not yet synced
	wake    chan struct{}

	// mu orders the store writes: a transition is written only while its target is in
	// the active set, and clearing a dropped target's health happens before any
	// transition of the targets that replace it.
	mu     sync.Mutex
	active map[string]ref  // target key → backend, as last handed to the checker
	pushed map[string]bool // target keys whose health was written to the store

	views map[string]*view // by service name; sync goroutine only
}

// change is what the store reported about one service since the last sync.
type change struct {
	svc *model.Service // the service now; nil if it is gone
	// deleted is set when the service was deleted at some point since the last sync, even
	// if it was created again: the store dropped its backends' health then.
	deleted bool
}

// ref locates the backend a target probes.
type ref struct {
	service   string
	serviceID uint32
	backendID uint32
}

// view is what healthsync derives from one service.
type view struct {
	id       uint32
	revision uint64
	entries  []entry
	// idle says, per backend ID, why a backend of the service is not probed.
	idle map[uint32]string
	// invalid is set when the checker cannot run the service's health check.
	invalid string
}

type entry struct {
	target    health.Target
	backendID uint32
}

func newSyncer(st *store.Store, o Options) *syncer {
	s := &syncer{
		st:        st,
		log:       o.Logger,
		probeAddr: o.probeAddr,
		pending:   map[string]change{},
		wake:      make(chan struct{}, 1),
		active:    map[string]ref{},
		pushed:    map[string]bool{},
		views:     map[string]*view{},
	}
	if s.log == nil {
		s.log = hclog.NewNullLogger()
	}
	if s.probeAddr == nil {
		s.probeAddr = func(a netip.AddrPort) netip.AddrPort { return a }
	}
	s.checker = health.New(health.Options{
		Logger:      s.log,
		Notify:      s.push,
		MaxInFlight: o.MaxInFlight,
		RootCAs:     o.RootCAs,
		Damping:     o.Damping,
	})
	snap, _, unlisten := st.SnapshotAndListen(s.enqueue)
	s.unlisten = unlisten
	for _, svc := range snap {
		s.pending[svc.Spec.Name] = change{svc: svc}
	}
	s.wake <- struct{}{}
	return s
}

// stop stops listening first, then stops the checker, which delivers (and so writes) the
// transitions it had already queued.
func (s *syncer) stop() {
	s.unlisten()
	s.checker.Stop()
}

// enqueue is the store listener. It runs under the store's lock, so it only records the
// change and wakes the sync goroutine. Status-only changes (datapath reports) never
// change what is probed. Health changes written by push are not status-only; they wake
// the sync goroutine, which finds the same targets and does not touch the checker.
func (s *syncer) enqueue(evs []store.Event) {
	s.pendMu.Lock()
	for _, ev := range evs {
		if ev.StatusOnly {
			continue
		}
		c := s.pending[ev.Name]
		if ev.Type == store.Deleted {
			c.svc, c.deleted = nil, true
		} else {
			c.svc = ev.Service
		}
		s.pending[ev.Name] = c
	}
	s.pendMu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// sync applies the pending changes to the checker.
func (s *syncer) sync() {
	s.pendMu.Lock()
	batch := s.pending
	s.pending = map[string]change{}
	s.pendMu.Unlock()

	changed := false
	deleted := map[string]bool{}
	var recreated map[string]bool
	for _, name := range slices.Sorted(maps.Keys(batch)) {
		c := batch[name]
		old := s.views[name]
		if c.deleted {
			deleted[name] = true
			if old != nil {
				delete(s.views, name)
				changed = true
			}
		}
		if c.svc == nil {
			continue
		}
		if old != nil && !c.deleted && old.revision == c.svc.Spec.Revision {
			// Same spec: a health or status change, most likely written by push.
			continue
		}
		v := s.view(c.svc)
		if v.invalid != "" && (old == nil || old.invalid != v.invalid) {
			s.log.Error("health check not run: the checker rejects it", "op", "healthsync",
				"service", name, "error", v.invalid)
		}
		if old != nil && !c.deleted && slices.Equal(old.entries, v.entries) {
			s.views[name] = v // e.g. a weight changed: nothing to probe differently
			continue
		}
		if old != nil && c.deleted {
			// The new service may produce the very keys of the old one (IDs are reused),
			// which the checker would take for the same targets and keep their state,
			// while the store has forgotten it. Drop them first so they start afresh.
			if recreated == nil {
				recreated = map[string]bool{}
			}
			recreated[name] = true
		}
		s.views[name] = v
		changed = true
	}
	if !changed {
		return
	}
	if recreated != nil {
		s.apply(recreated, deleted)
	}
	s.apply(nil, deleted)
}

// view derives the targets of one service.
func (s *syncer) view(ms *model.Service) *view {
	svc := ms.Spec
	v := &view{id: svc.Id, revision: svc.Revision, idle: map[uint32]string{}}
	spec, err := specOf(svc.HealthCheck)
	if err != nil {
		v.invalid = err.Error()
	}
	for i, b := range svc.Backends {
		switch {
		case svc.HealthCheck == nil:
			v.idle[b.Id] = "the service has no health check"
			continue
		case v.invalid != "":
			v.idle[b.Id] = "health check rejected: " + v.invalid
			continue
		case b.State == lbdv1.BackendState_BACKEND_STATE_DISABLED:
			v.idle[b.Id] = "backend disabled"
			continue
		}
		ap := ms.Backends[i].Addr
		v.entries = append(v.entries, entry{
			target: health.Target{
				// Both IDs and the address: IDs are reused once freed, and a target
				// that kept its key would keep a state the store no longer holds.
				Key:  fmt.Sprintf("%d/%d/%s", svc.Id, b.Id, ap),
				Addr: s.probeAddr(ap),
				Spec: spec,
			},
			backendID: b.Id,
		})
	}
	return v
}

// apply hands the targets of every service but those in skip to the checker, and clears
// the stored health of backends that are no longer probed (unless their service was
// deleted, which dropped it already).
func (s *syncer) apply(skip, deleted map[string]bool) {
	var targets []health.Target
	next := map[string]ref{}
	for name, v := range s.views {
		if skip[name] {
			continue
		}
		for _, e := range v.entries {
			targets = append(targets, e.target)
			next[e.target.Key] = ref{service: name, serviceID: v.id, backendID: e.backendID}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checker.Set(targets); err != nil {
		s.log.Error("health targets not updated", "op", "healthsync", "error", err)
		return
	}
	for _, key := range slices.Sorted(maps.Keys(s.active)) {
		r := s.active[key]
		if _, kept := next[key]; kept || !s.pushed[key] {
			continue
		}
		delete(s.pushed, key)
		v := s.views[r.service]
		if deleted[r.service] || v == nil || v.id != r.serviceID {
			continue
		}
		why, ok := v.idle[r.backendID]
		if !ok {
			why = "backend removed or replaced"
		}
		s.write(r, &lbdv1.BackendHealth{
			State:      lbdv1.HealthState_HEALTH_STATE_UNSPECIFIED,
			LastResult: "not probed: " + why,
		})
	}
	s.active = next
}

// push is the checker's Notify: it writes one transition into the store.
func (s *syncer) push(tr health.Transition) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.active[tr.Key]
	if !ok {
		return // the target was dropped after the transition was queued
	}
	if s.write(r, backendHealth(tr)) {
		s.pushed[tr.Key] = true
	}
}

// write records a backend's health. Called with mu held.
func (s *syncer) write(r ref, h *lbdv1.BackendHealth) bool {
	if err := s.st.SetBackendHealth(r.service, r.backendID, h); err != nil {
		// Only a service deleted meanwhile fails; the next sync drops its targets.
		s.log.Debug("backend health not recorded", "op", "healthsync", "service", r.service,
			"backend_id", r.backendID, "error", err)
		return false
	}
	return true
}

// backendHealth turns a transition into the API's view of it.
func backendHealth(tr health.Transition) *lbdv1.BackendHealth {
	h := &lbdv1.BackendHealth{
		State:              healthState(tr.To),
		LastResult:         resultText(tr.Status),
		LastTransitionTime: timestamppb.New(tr.At),
	}
	if at := tr.Status.Last.At; !at.IsZero() {
		h.LastCheckTime = timestamppb.New(at)
	}
	return h
}

func healthState(s health.State) lbdv1.HealthState {
	switch s {
	case health.Up:
		return lbdv1.HealthState_HEALTH_STATE_UP
	case health.Down:
		return lbdv1.HealthState_HEALTH_STATE_DOWN
	}
	return lbdv1.HealthState_HEALTH_STATE_UNSPECIFIED
}

// resultText describes the last probe the way operators read it: "ok", "ok: HTTP 200",
// or the error.
func resultText(st health.Status) string {
	switch {
	case st.Last.At.IsZero():
		return st.Reason
	case !st.Last.OK:
		return st.Last.Err
	case st.Last.Code != 0:
		return fmt.Sprintf("ok: HTTP %d", st.Last.Code)
	}
	return "ok"
}

// specOf translates a service's health check (normalized by the store) into a probe
// spec, and checks it as the checker will: the checker rejects a whole target set for
// one bad spec, so a spec it would refuse must stay out of the set.
func specOf(hc *lbdv1.HealthCheck) (health.Spec, error) {
	if hc == nil {
		return health.Spec{Kind: health.KindNone}, nil
	}
	sp := health.Spec{
		Port:               uint16(hc.Port),
		Path:               hc.Path,
		Host:               hc.Host,
		InsecureSkipVerify: hc.InsecureSkipVerify,
		StatusMin:          int(hc.ExpectedStatusMin),
		StatusMax:          int(hc.ExpectedStatusMax),
		Interval:           hc.Interval.AsDuration(),
		Timeout:            hc.Timeout.AsDuration(),
		Rise:               int(hc.Rise),
		Fall:               int(hc.Fall),
	}
	switch hc.Type {
	case lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_TCP:
		sp.Kind = health.KindTCP
	case lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_HTTP:
		sp.Kind = health.KindHTTP
	case lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_HTTPS:
		sp.Kind = health.KindHTTPS
	default:
		return sp, fmt.Errorf("unsupported health check type %v", hc.Type)
	}
	sp = sp.WithDefaults()
	if err := sp.Validate(); err != nil {
		return sp, fmt.Errorf("check health spec: %w", err)
	}
	if sp.Kind != health.KindTCP {
		if err := checkRequest(sp); err != nil {
			return sp, fmt.Errorf("check health request: %w", err)
		}
	}
	return sp, nil
}

// checkRequest renders the probe's request once, as the checker does, so that a path or
// host that Go's HTTP client refuses is caught here rather than failing every target.
func checkRequest(sp health.Spec) error {
	req, err := http.NewRequest(http.MethodGet, "http://192.0.2.1"+sp.Path, nil)
	if err != nil {
		return err
	}
	if sp.Host != "" {
		req.Host = sp.Host
	}
	return req.Write(io.Discard)
}
