package fleetsync

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/lbd-dev/lbd/internal/fleetview"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// refreshInterval is how often a node recomputes its registration (readiness and the
// digests of what its datapath holds): a divergence shows in the fleet view within
// about this long plus the watch's delay.
const refreshInterval = 2 * time.Second

// leaseTTL is how long a node that stopped renewing its lease (it stopped, or lost
// etcd) stays registered.
const leaseTTL = 10 * time.Second

// Registration builds this node's entry in the fleet: name, version, readiness and
// digests. Sync fills in the revision.
type Registration func() *lbdv1.FleetNode

// nodesView is the last set of registered nodes the node watch delivered.
type nodesView struct {
	mu    sync.Mutex
	nodes map[string]*lbdv1.FleetNode
	ok    bool
}

// RunRegistration keeps this node registered under a lease, refreshing its entry every
// refreshInterval when it changed, and follows every node's registration for View,
// until ctx ends.
func (s *Sync) RunRegistration(ctx context.Context, name string, reg Registration) error {
	updates := make(chan *lbdv1.FleetNode)
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	wg.Go(func() { errc <- s.cli.KeepRegistered(ctx, name, leaseTTL, updates) })
	wg.Go(func() {
		s.cli.WatchNodes(ctx, func(nodes map[string]*lbdv1.FleetNode, _ int64, ok bool) {
			s.view.mu.Lock()
			s.view.nodes, s.view.ok = nodes, ok
			s.view.mu.Unlock()
		})
	})
	var last *lbdv1.FleetNode
	t := time.NewTicker(refreshInterval)
	defer t.Stop()
	for {
		n := reg()
		n.Name, n.AppliedRevision = name, s.Revision()
		if last == nil || !proto.Equal(n, last) {
			sent := proto.Clone(n).(*lbdv1.FleetNode)
			sent.UpdateTime = timestamppb.Now()
			select {
			case updates <- sent:
				last = n
			case err := <-errc:
				return err
			case <-ctx.Done():
				return nil
			case <-t.C:
				continue
			}
		}
		select {
		case err := <-errc:
			return err
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// View implements api.Fleet: the registered nodes and the services on which the
// nodes that program services disagree.
func (s *Sync) View(context.Context) (*lbdv1.GetFleetResponse, error) {
	nodes, _ := s.nodes()
	resp := &lbdv1.GetFleetResponse{Revision: s.Revision()}
	if r := s.Stale(); r != "" {
		resp.Stale, resp.StaleReason = true, r
	}
	resp.Nodes = nodes
	resp.Diverged = diverged(nodes)
	return resp, nil
}

// Diverged counts the services the fleet's nodes disagree on, and says whether the
// view is current (lbd_fleet_diverged_services, lbd_fleet_stale).
func (s *Sync) Diverged() (int, bool) {
	nodes, ok := s.nodes()
	return len(diverged(nodes)), ok && s.Stale() == ""
}

func (s *Sync) nodes() ([]*lbdv1.FleetNode, bool) {
	s.view.mu.Lock()
	defer s.view.mu.Unlock()
	out := make([]*lbdv1.FleetNode, 0, len(s.view.nodes))
	for _, n := range s.view.nodes {
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b *lbdv1.FleetNode) int { return cmp.Compare(a.Name, b.Name) })
	return out, s.view.ok
}

func diverged(nodes []*lbdv1.FleetNode) []*lbdv1.DivergedService {
	var cmpd []fleetview.Node
	for _, n := range nodes {
		if n.ProgramsServices {
			cmpd = append(cmpd, fleetview.Node{Name: n.Name, Digests: n.Digests})
		}
	}
	return fleetview.Diverged(cmpd)
}
