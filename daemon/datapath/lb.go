//go:build linux

package datapath

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/lbd-dev/lbd/bpf/lbxdp"
	"github.com/lbd-dev/lbd/daemon/maglev"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// programmed is what the LB maps hold for one service ID; the manager diffs desired
// services against it so that only the difference is written.
type programmed struct {
	name     string
	key      lbxdp.ServiceKey
	svc      lbxdp.Service
	backends map[uint32]lbxdp.Backend
	// keys of backends, for naming them in traces and stats.
	backendKeys map[uint32]netip.AddrPort
	table       []uint32
	ranges      []netip.Prefix
}

// desired computes what the maps should hold for svc, and its Maglev table.
func desired(svc *lbdv1.Service) (*programmed, error) {
	vip, err := netip.ParseAddr(svc.Vip)
	if err != nil {
		return nil, fmt.Errorf("service %s: vip: %w", svc.Name, err)
	}
	proto, err := protoNum(svc.Protocol)
	if err != nil {
		return nil, fmt.Errorf("service %s: %w", svc.Name, err)
	}
	p := &programmed{
		name: svc.Name,
		key:  lbxdp.ServiceKey{VIP: vip, Port: uint16(svc.Port), Proto: proto},
		svc: lbxdp.Service{
			ID:            svc.Id,
			DropNoBackend: svc.NoBackendAction == lbdv1.NoBackendAction_NO_BACKEND_ACTION_DROP,
			SourceRanges:  len(svc.SourceRanges) > 0,
		},
		backends:    map[uint32]lbxdp.Backend{},
		backendKeys: map[uint32]netip.AddrPort{},
	}
	if svc.HashMode == lbdv1.HashMode_HASH_MODE_SOURCE_ADDRESS {
		p.svc.HashMode = lbxdp.HashSourceAddr
	}
	if a := svc.SessionAffinity; a != nil {
		p.svc.AffinityTimeout = a.Timeout.AsDuration()
	}
	for _, r := range svc.SourceRanges {
		pr, err := netip.ParsePrefix(r)
		if err != nil {
			return nil, fmt.Errorf("service %s: source range: %w", svc.Name, err)
		}
		p.ranges = append(p.ranges, pr)
	}
	var usable []maglev.Backend
	for _, b := range svc.Backends {
		addr, err := netip.ParseAddr(b.Address)
		if err != nil {
			return nil, fmt.Errorf("service %s: backend: %w", svc.Name, err)
		}
		node, err := netip.ParseAddr(b.NodeAddress)
		if err != nil {
			return nil, fmt.Errorf("service %s: backend node: %w", svc.Name, err)
		}
		ap := netip.AddrPortFrom(addr, uint16(b.Port))
		down := b.Health.GetState() == lbdv1.HealthState_HEALTH_STATE_DOWN
		switch {
		case b.State == lbdv1.BackendState_BACKEND_STATE_DISABLED:
			continue // neither new nor established flows
		case down && svc.ResetFlowsOnBackendDown:
			continue
		}
		// Draining and down backends, and those whose node this node cannot reach, stay
		// in the backend map so their established flows keep going; only usable ones
		// enter the Maglev table.
		p.backends[b.Id] = lbxdp.Backend{Addr: addr, Port: uint16(b.Port), Node: node}
		p.backendKeys[b.Id] = ap
		reachable := b.NodeReachability != lbdv1.Reachability_REACHABILITY_UNREACHABLE
		if b.State == lbdv1.BackendState_BACKEND_STATE_ACTIVE && !down && reachable {
			usable = append(usable, maglev.Backend{ID: b.Id, Key: maglev.Key(ap), Weight: b.Weight})
		}
	}
	table, err := maglev.Build(usable, svc.MaglevTableSize)
	if err != nil && !errors.Is(err, maglev.ErrNoBackends) {
		return nil, fmt.Errorf("service %s: maglev: %w", svc.Name, err)
	}
	p.table = table
	return p, nil
}

// Upsert implements reconcile.Datapath.
func (m *Manager) Upsert(_ context.Context, svc *lbdv1.Service) (map[uint32]uint32, error) {
	if m.lb == nil {
		return nil, nil
	}
	want, err := desired(svc)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.write(m.programmed[svc.Id], want); err != nil {
		return nil, err
	}
	return slots(want.table), nil
}

// write moves the maps from old (nil: nothing) to want, in an order that never lets a
// packet see a table entry without its backend or a service without its table.
func (m *Manager) write(old, want *programmed) error {
	if old == nil {
		old = &programmed{}
	}
	if err := m.writeBefore(old, want); err != nil {
		return err
	}
	if !slices.Equal(old.table, want.table) {
		if want.table == nil {
			if err := m.lb.DeleteMaglevTable(want.svc.ID); err != nil {
				return err
			}
		} else if err := m.lb.UpdateMaglevTable(want.svc.ID, old.table, want.table); err != nil {
			return err
		}
		if want.svc.AffinityTimeout > 0 {
			usable := map[uint32]bool{}
			for _, id := range want.table {
				usable[id] = true
			}
			if err := m.purgeAffinity(want.svc.ID, func(id uint32) bool { return usable[id] }); err != nil {
				return err
			}
		}
	}
	if err := m.writeAfter(old, want); err != nil {
		return err
	}
	m.trackNodes()
	return nil
}

// writeBefore adds what the new table may refer to: backends and source ranges.
func (m *Manager) writeBefore(old, want *programmed) error {
	for bid, b := range want.backends {
		if ob, ok := old.backends[bid]; ok && ob == b {
			continue
		}
		// An adopted entry with the right content need not be written again.
		if ob, ok := m.orphans[bid]; !ok || ob != b {
			if err := m.lb.UpsertBackend(bid, b); err != nil {
				return err
			}
		}
	}
	for _, r := range want.ranges {
		if !slices.Contains(old.ranges, r) {
			if err := m.lb.AddSourceRange(want.svc.ID, r); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeAfter switches the service entry and removes what the old table referred to.
func (m *Manager) writeAfter(old, want *programmed) error {
	id := want.svc.ID
	if old.key != want.key || old.svc != want.svc {
		if err := m.lb.UpsertService(want.key, want.svc); err != nil {
			return err
		}
		if old.key.VIP.IsValid() && old.key != want.key {
			if err := m.lb.DeleteService(old.key); err != nil {
				return err
			}
		}
	}
	for _, r := range old.ranges {
		if !slices.Contains(want.ranges, r) {
			if err := m.lb.DeleteSourceRange(id, r); err != nil {
				return err
			}
		}
	}
	var gone []uint32
	for bid := range old.backends {
		if _, ok := want.backends[bid]; !ok {
			if err := m.lb.DeleteBackend(bid); err != nil {
				return err
			}
			gone = append(gone, bid)
		}
	}
	if len(gone) > 0 {
		// Flows of removed or disabled backends re-balance at their next packet instead
		// of black-holing (a UDP flow moves at once).
		n, err := m.lb.DeleteConntrackByBackend(gone...)
		if err != nil {
			return err
		}
		for _, bid := range gone {
			if err := m.lb.ResetBackendCounters(bid); err != nil {
				return err
			}
		}
		m.log.Debug("backends removed from the datapath", "op", "reconcile", "service", want.name, "backends", len(gone), "flows", n)
	}
	m.programmed[id] = want
	return nil
}

// purgeAffinity drops the affinity entries (XDP and socket-level) of service id whose
// backend keep rejects. A table change passes the backends still in the table: a
// drained, down, disabled or removed backend keeps its established flows (conntrack),
// but no new flow may follow affinity to it, as none may reach it through the table.
// Removing a service drops all of its entries, so that a service that later gets the
// same ID does not inherit them.
func (m *Manager) purgeAffinity(id uint32, keep func(backendID uint32) bool) error {
	entries, err := m.lb.Affinity()
	if err != nil {
		return err
	}
	n := 0
	for _, e := range entries {
		if e.ServiceID == id && !keep(e.BackendID) {
			if err := m.lb.DeleteAffinity(e.ServiceID, e.Client); err != nil {
				return err
			}
			n++
		}
	}
	if m.sock != nil {
		sn, err := m.sock.PurgeAffinity(id, keep)
		if err != nil {
			return err
		}
		n += sn
	}
	if n > 0 {
		m.log.Debug("affinity purged", "op", "write", "service_id", id, "entries", n)
	}
	return nil
}

// Delete implements reconcile.Datapath.
func (m *Manager) Delete(_ context.Context, svc *lbdv1.Service) error {
	if m.lb == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.remove(svc.Id)
}

func (m *Manager) remove(id uint32) error {
	old := m.programmed[id]
	if old == nil {
		return nil
	}
	if err := m.lb.DeleteService(old.key); err != nil {
		return err
	}
	if err := m.lb.DeleteMaglevTable(id); err != nil {
		return err
	}
	for _, r := range old.ranges {
		if err := m.lb.DeleteSourceRange(id, r); err != nil {
			return err
		}
	}
	ids := slices.Collect(maps.Keys(old.backends))
	for _, bid := range ids {
		if err := m.lb.DeleteBackend(bid); err != nil {
			return err
		}
		if err := m.lb.ResetBackendCounters(bid); err != nil {
			return err
		}
	}
	if len(ids) > 0 {
		if _, err := m.lb.DeleteConntrackByBackend(ids...); err != nil {
			return err
		}
	}
	if err := m.lb.ResetServiceCounters(id); err != nil {
		return err
	}
	if err := m.purgeAffinity(id, func(uint32) bool { return false }); err != nil {
		return err
	}
	delete(m.programmed, id)
	m.trackNodes()
	return nil
}

// Sync implements reconcile.Datapath: it writes what differs between the services and
// the maps (adopted from an earlier daemon, or empty) and removes what is not desired.
func (m *Manager) Sync(_ context.Context, svcs []*lbdv1.Service) (map[string]map[uint32]uint32, error) {
	out := map[string]map[uint32]uint32{}
	if m.lb == nil {
		return out, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	start := time.Now()
	// Three phases so that all table swaps go to the kernel in one batch (one RCU grace
	// period instead of one per service): what tables refer to, the tables, the rest.
	keep := map[uint32]bool{}
	wants := make([]*programmed, 0, len(svcs))
	swaps := map[uint32][]uint32{}
	for _, svc := range svcs {
		want, err := desired(svc)
		if err != nil {
			return nil, err
		}
		old := m.programmed[svc.Id]
		if old == nil {
			old = &programmed{}
		}
		if err := m.writeBefore(old, want); err != nil {
			return nil, fmt.Errorf("sync service %s: %w", svc.Name, err)
		}
		switch {
		case slices.Equal(old.table, want.table):
		case want.table == nil:
			if err := m.lb.DeleteMaglevTable(svc.Id); err != nil {
				return nil, fmt.Errorf("sync service %s: %w", svc.Name, err)
			}
		case len(old.table) == len(want.table):
			// Same size: rewritten in place through the inactive half, no map swap.
			if err := m.lb.UpdateMaglevTable(svc.Id, old.table, want.table); err != nil {
				return nil, fmt.Errorf("sync service %s: %w", svc.Name, err)
			}
		default:
			swaps[svc.Id] = want.table
		}
		wants = append(wants, want)
		keep[svc.Id] = true
		out[svc.Name] = slots(want.table)
	}
	if err := m.lb.SetMaglevTables(swaps); err != nil {
		return nil, err
	}
	for _, want := range wants {
		old := m.programmed[want.svc.ID]
		if old == nil {
			old = &programmed{}
		}
		if err := m.writeAfter(old, want); err != nil {
			return nil, fmt.Errorf("sync service %s: %w", want.name, err)
		}
	}
	// Once, not per service: each call walks every backend of every service.
	m.trackNodes()
	for id := range m.programmed {
		if !keep[id] {
			if err := m.remove(id); err != nil {
				return nil, fmt.Errorf("remove stale service %d: %w", id, err)
			}
		}
	}
	// Backends left by an earlier daemon that no service refers to any more.
	live := map[uint32]bool{}
	for _, p := range m.programmed {
		for bid := range p.backends {
			live[bid] = true
		}
	}
	var gone []uint32
	for bid := range m.orphans {
		if !live[bid] {
			if err := m.lb.DeleteBackend(bid); err != nil {
				return nil, err
			}
			gone = append(gone, bid)
		}
	}
	if len(gone) > 0 {
		if _, err := m.lb.DeleteConntrackByBackend(gone...); err != nil {
			return nil, err
		}
	}
	m.orphans = nil
	m.synced = true
	m.log.Info("datapath maps synced", "op", "sync", "services", len(svcs), "took", time.Since(start))
	return out, nil
}

// adoptProgrammed reads what an earlier daemon left in the maps, so Sync writes only
// the difference.
func (m *Manager) adoptProgrammed() error {
	svcs, err := m.lb.Services()
	if err != nil {
		return err
	}
	ranges, err := m.lb.SourceRanges()
	if err != nil {
		return err
	}
	for k, s := range svcs {
		table, err := m.lb.MaglevTable(s.ID)
		if err != nil {
			return err
		}
		m.programmed[s.ID] = &programmed{key: k, svc: s, table: table, ranges: ranges[s.ID],
			backends: map[uint32]lbxdp.Backend{}, backendKeys: map[uint32]netip.AddrPort{}}
	}
	m.orphans = map[uint32]lbxdp.Backend{}
	for bid := uint32(1); bid < m.lb.Options().MaxBackends; bid++ {
		b, ok, err := m.lb.Backend(bid)
		if err != nil {
			return err
		}
		if ok {
			m.orphans[bid] = b
		}
	}
	return nil
}

// slots counts each backend's share of a table.
func slots(table []uint32) map[uint32]uint32 {
	out := map[uint32]uint32{}
	for id, n := range maglev.Shares(table) {
		out[id] = uint32(n)
	}
	return out
}
