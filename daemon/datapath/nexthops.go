//go:build linux

package datapath

import (
	"context"
	"maps"
	"net/netip"
	"slices"

	"github.com/lbd-dev/lbd/daemon/nexthop"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// The LB role keeps the next hops toward its backend nodes resolved (package nexthop):
// a freshly booted host has no neighbour entries, and bpf_fib_lookup in XDP cannot
// resolve one. When a path changes, the XDP program's route cache is flushed so that
// the change applies to the next packet, and OnPaths hears of it.

// startNextHops creates the LB role's next-hop tracker (RunNextHops runs it).
func (m *Manager) startNextHops() error {
	nh, err := nexthop.New(nexthop.Options{
		Logger:     m.log.Named("nexthop"),
		RecordPath: m.cfg.NeighbourRecord,
		OnChange:   m.onPaths,
	})
	if err != nil {
		return err
	}
	m.nh = nh
	return nil
}

// RunNextHops keeps the next hops toward the backend nodes resolved until ctx ends (LB
// role; otherwise it only waits).
func (m *Manager) RunNextHops(ctx context.Context) error {
	if m.nh == nil {
		<-ctx.Done()
		return nil
	}
	return m.nh.Run(ctx)
}

func (m *Manager) onPaths(paths map[netip.Addr]nexthop.Path) {
	m.mu.Lock()
	if m.lb != nil {
		if err := m.lb.FlushRouteCache(); err != nil {
			m.log.Error("flush the XDP route cache after a path change", "op", "nexthop", "error", err)
		}
	}
	m.mu.Unlock()
	if m.cfg.OnPaths != nil {
		m.cfg.OnPaths(paths)
	}
}

// NextHops returns the path toward every backend node, sorted by node address (LB role).
func (m *Manager) NextHops() []*lbdv1.NextHop {
	if m.nh == nil {
		return nil
	}
	paths := m.nh.Paths()
	out := make([]*lbdv1.NextHop, 0, len(paths))
	for _, a := range slices.SortedFunc(maps.Keys(paths), netip.Addr.Compare) {
		p := paths[a]
		out = append(out, &lbdv1.NextHop{
			NodeAddress: a.String(), Reachable: p.Reachable, Reason: p.Reason,
			NextHop: addrString(p.NextHop), Interface: p.Interface, Source: addrString(p.Source),
			Neighbour: p.Neighbour, Managed: p.Managed,
		})
	}
	return out
}

// ReleaseNeighbours deletes the neighbour entries that an LB node's lbd recorded in
// record, for a datapath detached while no lbd runs (lbd --detach).
func ReleaseNeighbours(ctx context.Context, record string) error {
	nh, err := nexthop.New(nexthop.Options{RecordPath: record})
	if err != nil {
		return err
	}
	return nh.Release(ctx)
}

// track counts p's backends in (delta 1) or out of (-1) the backend nodes the maps
// refer to. Caller holds mu.
func (m *Manager) track(p *programmed, delta int) {
	for _, b := range p.backends {
		had, ok := m.nodes[b.Node]
		n := had + delta
		switch {
		case n > 0:
			m.nodes[b.Node] = n
			m.nodesChanged = m.nodesChanged || !ok
		case ok:
			delete(m.nodes, b.Node)
			m.nodesChanged = true
		}
	}
}

// syncNodes hands the tracker the node of every backend in the maps when that set
// changed: a change that keeps the set (a weight, a drain) costs nothing here, where
// sorting every node each time was a fifth of a weight change at 10,000 services.
// Caller holds mu.
func (m *Manager) syncNodes() {
	if m.nh == nil || !m.attached || !m.nodesChanged {
		return
	}
	m.nodesChanged = false
	m.nh.SetNodes(slices.SortedFunc(maps.Keys(m.nodes), netip.Addr.Compare))
}
