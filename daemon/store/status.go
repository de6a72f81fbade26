package store

import (
	"fmt"
	"maps"
	"slices"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// usable reports whether a backend takes new flows: active and not marked down.
func usable(b *lbdv1.Backend, h *lbdv1.BackendHealth) bool {
	active := b.State == lbdv1.BackendState_BACKEND_STATE_ACTIVE
	return active && (h == nil || h.State != lbdv1.HealthState_HEALTH_STATE_DOWN)
}

// withStatus returns a copy of svc with its output-only fields filled. Caller holds mu.
func (s *Store) withStatus(svc *lbdv1.Service) *lbdv1.Service {
	out := proto.Clone(svc).(*lbdv1.Service)
	rt := s.status[svc.Name]
	var n, draining, disabled, down int
	for _, b := range out.Backends {
		if rt != nil {
			if h := rt.health[b.Id]; h != nil {
				b.Health = proto.Clone(h).(*lbdv1.BackendHealth)
			}
			b.TableSlots = rt.tableSlots[b.Id]
		}
		switch {
		case usable(b, b.Health):
			n++
		case b.State == lbdv1.BackendState_BACKEND_STATE_DRAINING:
			draining++
		case b.State == lbdv1.BackendState_BACKEND_STATE_DISABLED:
			disabled++
		default:
			down++
		}
	}
	st := &lbdv1.ServiceStatus{UsableBackends: uint32(n), AdvertiseReason: s.opts.AdvertiseReason}
	if st.AdvertiseReason == "" {
		st.AdvertiseReason = "this node runs no BGP speaker"
	}
	if rt != nil && rt.hasAdvertise {
		st.Advertised, st.AdvertiseReason = rt.advertised, rt.advertiseReason
	}
	switch {
	case s.opts.StatusReason != "":
		st.State, st.Reason = lbdv1.ServiceState_SERVICE_STATE_PENDING, s.opts.StatusReason
	case rt == nil || rt.appliedRevision < svc.Revision:
		st.State, st.Reason = lbdv1.ServiceState_SERVICE_STATE_PENDING, fmt.Sprintf("revision %d not yet programmed into the datapath", svc.Revision)
	case rt.datapathErr != "":
		st.State, st.Reason = lbdv1.ServiceState_SERVICE_STATE_ERROR, "datapath: "+rt.datapathErr
	case len(out.Backends) == 0:
		st.State, st.Reason = lbdv1.ServiceState_SERVICE_STATE_NO_BACKENDS, "the service has no backends; new flows are "+noBackendVerb(svc)
	case n == 0:
		st.State, st.Reason = lbdv1.ServiceState_SERVICE_STATE_NO_BACKENDS,
			fmt.Sprintf("none of %d backends is usable (%d draining, %d disabled, %d down); new flows are %s", len(out.Backends), draining, disabled, down, noBackendVerb(svc))
	default:
		st.State, st.Reason = lbdv1.ServiceState_SERVICE_STATE_READY, fmt.Sprintf("%d of %d backends usable", n, len(out.Backends))
	}
	if rt != nil && !rt.updated.IsZero() {
		st.UpdateTime = timestamppb.New(rt.updated)
	}
	out.Status = st
	return out
}

func noBackendVerb(svc *lbdv1.Service) string {
	if svc.NoBackendAction == lbdv1.NoBackendAction_NO_BACKEND_ACTION_DROP {
		return "dropped"
	}
	return "rejected"
}

func (s *Store) runtime(name string) *serviceRuntime {
	rt := s.status[name]
	if rt == nil {
		rt = &serviceRuntime{tableSlots: map[uint32]uint32{}, health: map[uint32]*lbdv1.BackendHealth{}}
		s.status[name] = rt
	}
	return rt
}

// ReportDatapath records that the datapath programmed revision of a service, with an
// error or with each backend's share of the Maglev table. Reports for a service that no
// longer exists or for an older revision than already reported are ignored with
// ErrStaleRevision.
func (s *Store) ReportDatapath(name string, revision uint64, err error, tableSlots map[uint32]uint32) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	svc, ok := s.services[name]
	if !ok || revision > svc.Revision || (s.status[name] != nil && revision < s.status[name].appliedRevision) {
		s.mu.Unlock()
		return ErrStaleRevision
	}
	rt := s.runtime(name)
	rt.appliedRevision, rt.updated = revision, time.Now()
	rt.datapathErr = ""
	if err != nil {
		rt.datapathErr = err.Error()
	}
	rt.tableSlots = tableSlots
	ev := Event{Type: Modified, Name: name, Service: s.withStatus(svc), StatusOnly: true}
	s.mu.Unlock()
	s.notify([]Event{ev})
	return nil
}

// SetAdvertised records whether the BGP advertiser announces the service's VIP, and
// why (or why not). It only changes output-only status.
func (s *Store) SetAdvertised(name string, advertised bool, reason string) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	svc, ok := s.services[name]
	if !ok {
		s.mu.Unlock()
		return notFound("service %q not found", name)
	}
	rt := s.runtime(name)
	if rt.hasAdvertise && rt.advertised == advertised && rt.advertiseReason == reason {
		s.mu.Unlock()
		return nil
	}
	rt.hasAdvertise, rt.advertised, rt.advertiseReason = true, advertised, reason
	rt.updated = time.Now()
	ev := Event{Type: Modified, Name: name, Service: s.withStatus(svc), StatusOnly: true}
	s.mu.Unlock()
	s.notify([]Event{ev})
	return nil
}

// SetBackendHealth records the health of a backend (by ID) of a service. The health
// checker calls it on every transition.
func (s *Store) SetBackendHealth(name string, backendID uint32, h *lbdv1.BackendHealth) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	svc, ok := s.services[name]
	if !ok {
		s.mu.Unlock()
		return notFound("service %q not found", name)
	}
	rt := s.runtime(name)
	before := rt.health[backendID]
	rt.health[backendID] = proto.Clone(h).(*lbdv1.BackendHealth)
	rt.updated = time.Now()
	// UNKNOWN→UP (every backend's first passing probe) changes no table: only a change
	// of usability needs the reconciler.
	down := func(h *lbdv1.BackendHealth) bool { return h.GetState() == lbdv1.HealthState_HEALTH_STATE_DOWN }
	ev := Event{Type: Modified, Name: name, Service: s.withStatus(svc), StatusOnly: down(before) == down(h)}
	s.mu.Unlock()
	s.notify([]Event{ev})
	return nil
}

// notify hands events to every listener. Caller holds writeMu (so events arrive in commit
// order) but not mu.
func (s *Store) notify(events []Event) {
	if len(events) == 0 {
		return
	}
	s.mu.RLock()
	ls := make([]Listener, 0, len(s.listeners))
	for _, id := range slices.Sorted(maps.Keys(s.listeners)) {
		ls = append(ls, s.listeners[id])
	}
	s.mu.RUnlock()
	for _, l := range ls {
		l(events)
	}
}
