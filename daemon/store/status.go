package store

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/lbd-dev/lbd/daemon/model"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// usable reports whether a backend takes new flows: active, not marked down (health
// h, nil if unknown), and its node not known to be unreachable from this node.
func usable(state lbdv1.BackendState, h *lbdv1.BackendHealth, reach lbdv1.Reachability) bool {
	return state == lbdv1.BackendState_BACKEND_STATE_ACTIVE && (h == nil || h.State != lbdv1.HealthState_HEALTH_STATE_DOWN) &&
		reach != lbdv1.Reachability_REACHABILITY_UNREACHABLE
}

// withStatus returns a copy of svc's message with its output-only fields filled. Caller
// holds mu.
func (s *Store) withStatus(svc *model.Service) *lbdv1.Service {
	return s.addStatus(proto.Clone(svc.Spec).(*lbdv1.Service), svc)
}

// typedWithStatus is withStatus with the service's addresses, for listeners. Caller
// holds mu.
func (s *Store) typedWithStatus(svc *model.Service) *model.Service {
	return svc.WithSpec(s.withStatus(svc))
}

// addStatus fills the output-only fields of out, a copy of svc's message, and returns
// it. Caller holds mu.
func (s *Store) addStatus(out *lbdv1.Service, svc *model.Service) *lbdv1.Service {
	rt := s.status[svc.Spec.Name]
	t := s.tally(svc, rt, func(i int, h *lbdv1.BackendHealth, reach lbdv1.Reachability) {
		b := out.Backends[i]
		if h != nil {
			b.Health = proto.Clone(h).(*lbdv1.BackendHealth)
		}
		if rt != nil {
			b.TableSlots = rt.tableSlots[b.Id]
		}
		b.NodeReachability = reach
	})
	st := &lbdv1.ServiceStatus{UsableBackends: uint32(t.usable), AdvertiseReason: s.opts.AdvertiseReason}
	if st.AdvertiseReason == "" {
		st.AdvertiseReason = "this node runs no BGP speaker"
	}
	if rt != nil && rt.hasAdvertise {
		st.Advertised, st.AdvertiseReason = rt.advertised, rt.advertiseReason
	}
	st.State, st.Reason = s.state(svc.Spec, rt, t, true)
	if rt != nil && !rt.updated.IsZero() {
		st.UpdateTime = timestamppb.New(rt.updated)
	}
	out.Status = st
	return out
}

// tally counts what a service's backends can do.
type tally struct {
	backends, usable, draining, disabled, down int
	unreachable                                []string // why, per unreachable node, in backend order
}

// tally counts svc's backends, and calls each (if not nil) with each one's index,
// health (nil if unknown) and node reachability. Caller holds mu.
func (s *Store) tally(svc *model.Service, rt *serviceRuntime, each func(i int, h *lbdv1.BackendHealth, reach lbdv1.Reachability)) tally {
	t := tally{backends: len(svc.Backends)}
	for i, b := range svc.Spec.Backends {
		var h *lbdv1.BackendHealth
		if rt != nil {
			h = rt.health[b.Id]
		}
		reach := lbdv1.Reachability_REACHABILITY_UNSPECIFIED
		r, known := s.nodeReach(svc.Backends[i].Node)
		if known {
			reach = lbdv1.Reachability_REACHABILITY_REACHABLE
			if !r.Reachable {
				reach = lbdv1.Reachability_REACHABILITY_UNREACHABLE
			}
		}
		if each != nil {
			each(i, h, reach)
		}
		switch {
		case usable(b.State, h, reach):
			t.usable++
		case b.State == lbdv1.BackendState_BACKEND_STATE_DRAINING:
			t.draining++
		case b.State == lbdv1.BackendState_BACKEND_STATE_DISABLED:
			t.disabled++
		case reach == lbdv1.Reachability_REACHABILITY_UNREACHABLE:
			if !slices.Contains(t.unreachable, r.Reason) {
				t.unreachable = append(t.unreachable, r.Reason)
			}
		default:
			t.down++
		}
	}
	return t
}

// state is svc's state and, if asked, why. Caller holds mu.
func (s *Store) state(svc *lbdv1.Service, rt *serviceRuntime, t tally, withReason bool) (lbdv1.ServiceState, string) {
	why := func(format string, args ...any) string {
		if !withReason {
			return ""
		}
		return fmt.Sprintf(format, args...)
	}
	unreachable := func() string {
		if len(t.unreachable) == 0 {
			return ""
		}
		return "; unreachable: " + strings.Join(t.unreachable, "; ")
	}
	switch {
	case s.opts.StatusReason != "":
		return lbdv1.ServiceState_SERVICE_STATE_PENDING, s.opts.StatusReason
	case rt == nil || rt.appliedRevision < svc.Revision:
		return lbdv1.ServiceState_SERVICE_STATE_PENDING, why("revision %d not yet programmed into the datapath", svc.Revision)
	case rt.appliedSeq < rt.wantSeq:
		return lbdv1.ServiceState_SERVICE_STATE_PENDING,
			"the backends that take new flows changed (health or next hop); not yet programmed into the datapath"
	case rt.datapathErr != "":
		return lbdv1.ServiceState_SERVICE_STATE_ERROR, why("datapath: %s", rt.datapathErr)
	case t.backends == 0:
		return lbdv1.ServiceState_SERVICE_STATE_NO_BACKENDS, why("the service has no backends; new flows are %s", noBackendVerb(svc))
	case t.usable == 0:
		return lbdv1.ServiceState_SERVICE_STATE_NO_BACKENDS,
			why("none of %d backends is usable (%d draining, %d disabled, %d down%s); new flows are %s",
				t.backends, t.draining, t.disabled, t.down, unreachable(), noBackendVerb(svc))
	}
	return lbdv1.ServiceState_SERVICE_STATE_READY, why("%d of %d backends usable%s", t.usable, t.backends, unreachable())
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

// editRuntime changes a service's output-only data under the store's locks and tells
// listeners. edit returns whether anything changed and whether the change leaves the
// datapath alone (status-only), or an error that is returned as is.
func (s *Store) editRuntime(name string, edit func(svc *lbdv1.Service, rt *serviceRuntime) (changed, statusOnly bool, err error)) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	svc, ok := s.services[name]
	if !ok {
		s.mu.Unlock()
		return notFound("service %q not found", name)
	}
	changed, statusOnly, err := edit(svc.Spec, s.runtime(name))
	if err != nil || !changed {
		s.mu.Unlock()
		return err
	}
	s.seq++
	rt := s.status[name]
	rt.updated = time.Now()
	if !statusOnly {
		rt.wantSeq = s.seq
	}
	ev := Event{Type: Modified, Name: name, Service: s.typedWithStatus(svc), StatusOnly: statusOnly, Seq: s.seq}
	s.mu.Unlock()
	s.notify([]Event{ev})
	return nil
}

// ErrStaleRevision is returned by ReportDatapath for a revision that is no longer current.
var ErrStaleRevision = errors.New("stale revision")

// ReportDatapath records that the datapath programmed a service as of the event (or
// snapshot) with Seq seq, at the given revision, with an error or with each backend's
// share of the Maglev table. Reports for a service that no longer exists, or older than
// one already reported, are ignored with ErrStaleRevision.
func (s *Store) ReportDatapath(name string, revision, seq uint64, err error, tableSlots map[uint32]uint32) error {
	rerr := s.editRuntime(name, func(svc *lbdv1.Service, rt *serviceRuntime) (bool, bool, error) {
		if revision > svc.Revision || revision < rt.appliedRevision || seq < rt.appliedSeq {
			return false, false, ErrStaleRevision
		}
		rt.appliedRevision, rt.appliedSeq, rt.datapathErr, rt.tableSlots = revision, seq, "", tableSlots
		if err != nil {
			rt.datapathErr = err.Error()
		}
		return true, true, nil
	})
	if Code(rerr) == codes.NotFound {
		return ErrStaleRevision
	}
	return rerr
}

// Reconciled tells the store that the datapath applied every change up to Seq seq, so
// IDs those changes released may be handed out again (Options.HoldIDs).
func (s *Store) Reconciled(seq uint64) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.svcIDs.release(seq)
	s.beIDs.release(seq)
	close(s.reconciled) // wakes the changes waiting for held IDs (retryHeld)
	s.reconciled = make(chan struct{})
}

// SetAdvertised records whether the BGP advertiser announces the service's VIP, and
// why (or why not). It only changes output-only status, and tells listeners only when
// something changed.
func (s *Store) SetAdvertised(name string, advertised bool, reason string) error {
	return s.editRuntime(name, func(_ *lbdv1.Service, rt *serviceRuntime) (bool, bool, error) {
		if rt.hasAdvertise && rt.advertised == advertised && rt.advertiseReason == reason {
			return false, true, nil
		}
		rt.hasAdvertise, rt.advertised, rt.advertiseReason = true, advertised, reason
		return true, true, nil
	})
}

// NodeReach is whether this node reaches a backend node (the LB role's next hop
// tracker says), and why or why not.
type NodeReach struct {
	Reachable bool
	Reason    string
}

// nodeReach is what is known of a backend's node. Caller holds mu.
func (s *Store) nodeReach(node netip.Addr) (NodeReach, bool) {
	if len(s.nodes) == 0 {
		return NodeReach{}, false
	}
	r, ok := s.nodes[node]
	return r, ok
}

// SetNodeReachability records which backend nodes this node reaches (replacing what it
// held). A backend whose node is unreachable takes no new flows here: services whose
// usable backends change are sent to the reconciler, those whose status only reads
// differently get a status update, and the others (a reachable node's next hop that
// changed its neighbour state, say) nothing. The work is that of the nodes reported and
// of the services they touch.
func (s *Store) SetNodeReachability(nodes map[netip.Addr]NodeReach) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	old := s.nodes
	s.nodes = maps.Clone(nodes)
	// What a service shows of a node: whether it is known, reachable, and why not.
	shown := func(r NodeReach, ok bool) NodeReach {
		if !ok || r.Reachable {
			return NodeReach{Reachable: ok}
		}
		return r
	}
	affected := map[string]bool{}
	usability := map[string]bool{}
	note := func(a netip.Addr) {
		o, hadOld := old[a]
		n, hasNew := nodes[a]
		if shown(o, hadOld) == shown(n, hasNew) {
			return
		}
		use := (hadOld && !o.Reachable) != (hasNew && !n.Reachable)
		for name := range s.byNode[a] {
			affected[name] = true
			usability[name] = usability[name] || use
		}
	}
	for a := range nodes {
		note(a)
	}
	for a := range old {
		if _, ok := nodes[a]; !ok {
			note(a)
		}
	}
	if len(affected) == 0 {
		s.mu.Unlock()
		return
	}
	s.seq++
	var events []Event
	for _, name := range slices.Sorted(maps.Keys(affected)) {
		rt := s.runtime(name)
		rt.updated = time.Now()
		if usability[name] {
			rt.wantSeq = s.seq
		}
		events = append(events, Event{Type: Modified, Name: name, Service: s.typedWithStatus(s.services[name]), StatusOnly: !usability[name], Seq: s.seq})
	}
	s.mu.Unlock()
	s.notify(events)
}

// indexNodes adds (n = 1) or removes (n = -1) the backends of svc in the index of the
// services behind each node (keyed as the next-hop tracker keys them). Caller holds mu.
func (s *Store) indexNodes(svc *model.Service, n int) {
	name := svc.Spec.Name
	for _, b := range svc.Backends {
		a := b.Node
		names := s.byNode[a]
		if names == nil {
			names = map[string]int{}
			s.byNode[a] = names
		}
		if names[name] += n; names[name] <= 0 {
			delete(names, name)
			if len(names) == 0 {
				delete(s.byNode, a)
			}
		}
	}
}

// SetBackendHealth records the health of a backend (by ID) of a service. The health
// checker calls it on every transition.
func (s *Store) SetBackendHealth(name string, backendID uint32, h *lbdv1.BackendHealth) error {
	return s.editRuntime(name, func(_ *lbdv1.Service, rt *serviceRuntime) (bool, bool, error) {
		before := rt.health[backendID]
		rt.health[backendID] = proto.Clone(h).(*lbdv1.BackendHealth)
		// UNKNOWN→UP (every backend's first passing probe) changes no table: only a
		// change of usability needs the reconciler.
		down := func(h *lbdv1.BackendHealth) bool { return h.GetState() == lbdv1.HealthState_HEALTH_STATE_DOWN }
		return true, down(before) == down(h), nil
	})
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
