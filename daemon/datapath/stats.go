//go:build linux

package datapath

import (
	"cmp"
	"context"
	"net/netip"
	"slices"
	"strings"

	"github.com/lbd-dev/lbd/bpf/backendtc"
	"github.com/lbd-dev/lbd/bpf/lbxdp"
	"github.com/lbd-dev/lbd/daemon/servicematch"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// GetStats reads the counters of the services the request selects (with their
// backends' unless it omits them), in the order and number it asks for, then the
// per-reason, socket and conntrack event counters. The BPF counters are read in
// batches, so the cost grows with the highest ID read, not with a call per ID.
func (m *Manager) GetStats(_ context.Context, r *lbdv1.GetStatsRequest) (*lbdv1.GetStatsResponse, error) {
	sel, err := servicematch.Compile(r.GetServices())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "services%v", err)
	}
	order, ok := statsOrders[r.GetOrderBy()]
	if !ok {
		return nil, status.Errorf(codes.InvalidArgument, "order_by: %v is not a known order", r.GetOrderBy())
	}
	backendsOf := func(string) bool { return true }
	if r.GetOmitBackends() {
		backendsOf = nil
	}
	return m.stats(sel, order, int(r.GetLimit()), backendsOf)
}

// lbReason names an LB-node reason as GetStats and lbd_datapath_packets_total{reason}
// do (backendReason names a backend node's counters).
func lbReason(r lbxdp.DropReason) string { return r.CounterName() }

// PacketReasons returns every reason GetStats and lbd_datapath_packets_total{reason}
// can name, in the order GetStats lists them: the LB program's, then the backend
// programs'. Rules and dashboards are checked against it.
func PacketReasons() []string {
	var out []string
	for _, r := range lbxdp.DropReasons() {
		out = append(out, lbReason(r))
	}
	for _, c := range backendtc.AllCounters() {
		out = append(out, backendReason(c))
	}
	return out
}

// Stats reads the counters of every service, of the backends of the services
// backendsOf selects (none if it is nil), and the per-reason, socket and conntrack
// event counters: what a metrics scrape needs, without building what it would not
// export.
func (m *Manager) Stats(backendsOf func(service string) bool) (*lbdv1.GetStatsResponse, error) {
	return m.stats(servicematch.Set{}, statsOrders[lbdv1.StatsOrder_STATS_ORDER_NAME], 0, backendsOf)
}

func (m *Manager) stats(sel servicematch.Set, order countersOrder, limit int, backendsOf func(string) bool) (*lbdv1.GetStatsResponse, error) {
	resp := &lbdv1.GetStatsResponse{}
	var err error
	if m.lb != nil {
		if resp.Services, err = m.serviceStats(sel, order, limit, backendsOf); err != nil {
			return nil, err
		}
		drops, err := m.lb.DropCounters()
		if err != nil {
			return nil, status.Errorf(codes.Internal, "read counters: %v", err)
		}
		for _, r := range lbxdp.DropReasons() {
			resp.Reasons = append(resp.Reasons, &lbdv1.Counter{Name: lbReason(r), Packets: drops[r].Packets, Bytes: drops[r].Bytes})
		}
		evs, err := m.lb.ConntrackEvents()
		if err != nil {
			return nil, status.Errorf(codes.Internal, "read counters: %v", err)
		}
		for _, e := range evs {
			resp.ConntrackEvents = append(resp.ConntrackEvents, &lbdv1.EventCounter{Name: e.Event.String(), Count: e.Count})
		}
		routes, err := m.lb.QUICRoutes()
		if err != nil {
			return nil, status.Errorf(codes.Internal, "read counters: %v", err)
		}
		for _, r := range routes {
			resp.QuicRoutes = append(resp.QuicRoutes, &lbdv1.EventCounter{Name: r.Route.String(), Count: r.Count})
		}
	} else if names := sel.Names(); len(names) > 0 {
		return nil, status.Errorf(codes.NotFound, "services: this node has no LB datapath, so no service %q", names[0])
	}
	if m.be != nil {
		cs, err := m.be.Counters()
		if err != nil {
			return nil, status.Errorf(codes.Internal, "read counters: %v", err)
		}
		for _, c := range backendtc.AllCounters() {
			resp.Reasons = append(resp.Reasons, &lbdv1.Counter{Name: backendReason(c), Packets: cs[c]})
		}
	}
	if err := m.socketCounters(resp); err != nil {
		return nil, status.Errorf(codes.Internal, "read counters: %v", err)
	}
	return resp, nil
}

// countersOrder compares two counters for an order: largest first, or 0 for the name
// order, which the callers apply after it.
type countersOrder func(a, b lbxdp.Counters) int

var statsOrders = map[lbdv1.StatsOrder]countersOrder{
	lbdv1.StatsOrder_STATS_ORDER_UNSPECIFIED: func(_, _ lbxdp.Counters) int { return 0 },
	lbdv1.StatsOrder_STATS_ORDER_NAME:        func(_, _ lbxdp.Counters) int { return 0 },
	lbdv1.StatsOrder_STATS_ORDER_PACKETS:     func(a, b lbxdp.Counters) int { return cmp.Compare(b.Packets, a.Packets) },
	lbdv1.StatsOrder_STATS_ORDER_BYTES:       func(a, b lbxdp.Counters) int { return cmp.Compare(b.Bytes, a.Bytes) },
	lbdv1.StatsOrder_STATS_ORDER_NEW_FLOWS:   func(a, b lbxdp.Counters) int { return cmp.Compare(b.NewFlows, a.NewFlows) },
}

// serviceStats reads the counters of the programmed services that sel selects (every
// one if it is empty), orders and limits them, and reads the backends' of those that
// backendsOf selects (none if it is nil).
func (m *Manager) serviceStats(sel servicematch.Set, order countersOrder, limit int, backendsOf func(string) bool) ([]*lbdv1.ServiceStats, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	type pick struct {
		id uint32
		p  *programmed
		c  lbxdp.Counters
	}
	var picked []pick
	var maxSvc, maxBe uint32
	found := map[string]bool{}
	for id, p := range m.programmed {
		if !sel.Empty() && !sel.Match(p.name) {
			continue
		}
		picked = append(picked, pick{id: id, p: p})
		found[p.name] = true
		maxSvc = max(maxSvc, id)
	}
	for _, n := range sel.Names() {
		if !found[n] {
			return nil, status.Errorf(codes.NotFound, "services: no service %q is programmed on this node", n)
		}
	}
	if len(picked) == 0 {
		return nil, nil
	}
	svcC, err := m.lb.AllServiceCounters(maxSvc + 1)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read counters: %v", err)
	}
	for i := range picked {
		picked[i].c = svcC[picked[i].id]
	}
	slices.SortFunc(picked, func(a, b pick) int { return cmp.Or(order(a.c, b.c), strings.Compare(a.p.name, b.p.name)) })
	if limit > 0 && limit < len(picked) {
		picked = picked[:limit]
	}
	withBackends := make([]bool, len(picked))
	for i, pk := range picked {
		if withBackends[i] = backendsOf != nil && backendsOf(pk.p.name); withBackends[i] {
			for bid := range pk.p.backendKeys {
				maxBe = max(maxBe, bid)
			}
		}
	}
	var beC []lbxdp.Counters
	if maxBe > 0 {
		if beC, err = m.lb.AllBackendCounters(maxBe + 1); err != nil {
			return nil, status.Errorf(codes.Internal, "read counters: %v", err)
		}
	}
	type be struct {
		k netip.AddrPort
		c lbxdp.Counters
	}
	var bes []be
	out := make([]*lbdv1.ServiceStats, 0, len(picked))
	for i, pk := range picked {
		ss := &lbdv1.ServiceStats{ServiceName: pk.p.name, Packets: pk.c.Packets, Bytes: pk.c.Bytes, NewFlows: pk.c.NewFlows}
		if withBackends[i] {
			bes = bes[:0]
			for bid, k := range pk.p.backendKeys {
				bes = append(bes, be{k, beC[bid]})
			}
			slices.SortFunc(bes, func(a, b be) int { return cmp.Or(order(a.c, b.c), a.k.Compare(b.k)) })
			ss.Backends = make([]*lbdv1.BackendStats, len(bes))
			for i, b := range bes {
				ss.Backends[i] = &lbdv1.BackendStats{Address: b.k.Addr().String(), Port: uint32(b.k.Port()),
					Packets: b.c.Packets, Bytes: b.c.Bytes, NewFlows: b.c.NewFlows}
			}
		}
		out = append(out, ss)
	}
	return out, nil
}
