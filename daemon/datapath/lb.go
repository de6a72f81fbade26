//go:build linux

package datapath

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/lbd-dev/lbd/bpf/lbxdp"
	"github.com/lbd-dev/lbd/daemon/maglev"
	"github.com/lbd-dev/lbd/daemon/model"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// programmed is what the LB maps hold for one service ID; the manager diffs desired
// services against it so that only the difference is written. It keeps no Maglev
// table: the kernel holds it, with the digest of what it was built from (tables.go).
type programmed struct {
	name     string
	key      lbxdp.ServiceKey
	svc      lbxdp.Service
	backends map[uint32]lbxdp.Backend
	// keys of backends, for naming them in traces and stats.
	backendKeys map[uint32]netip.AddrPort
	ranges      []netip.Prefix
	table       tableInfo
	// quicIDs: the backend ID of each QUIC server ID (its bytes as a string).
	quicIDs map[string]uint32
}

// tableInfo is what the manager keeps of a service's Maglev table.
type tableInfo struct {
	size   uint32            // M; 0: the service has no table
	digest uint64            // maglev.Digest of the backends and size it was built from
	shares map[uint32]uint32 // slots per backend ID, for the service's status
	// present: the service has a table map, even one whose slots are not as recorded.
	present bool
	// usable are the backends it is built from; indexes is how many backend indexes a
	// new map for it gets: every backend of the service, so that one becoming usable
	// needs no new map.
	usable  []maglev.Backend
	indexes int
}

// has reports whether a table is in the maps and holds the slots the digest names.
func (t tableInfo) has(size uint32, digest uint64) bool {
	return t.size != 0 && t.size == size && t.digest == digest
}

// plan is one service on its way to the maps: what they should hold, and the table
// (built by buildTables) until it is written.
type plan struct {
	want    *programmed
	old     *programmed
	pending *lbxdp.PendingTable
	err     error
}

// desired computes what the maps should hold for svc; its Maglev table is built later
// (buildTables), and only when the digest of its input changed.
func desired(ms *model.Service) (*plan, error) {
	svc := ms.Spec
	proto, err := protoNum(svc.Protocol)
	if err != nil {
		return nil, fmt.Errorf("service %s: %w", svc.Name, err)
	}
	p := &programmed{
		name: svc.Name,
		key:  lbxdp.ServiceKey{VIP: ms.VIP, Port: uint16(svc.Port), Proto: proto},
		svc: lbxdp.Service{
			ID:            svc.Id,
			DropNoBackend: svc.NoBackendAction == lbdv1.NoBackendAction_NO_BACKEND_ACTION_DROP,
			SourceRanges:  len(ms.SourceRanges) > 0,
		},
		backends:    make(map[uint32]lbxdp.Backend, len(svc.Backends)),
		backendKeys: make(map[uint32]netip.AddrPort, len(svc.Backends)),
	}
	if q := svc.Quic; q != nil {
		p.svc.QUIC = lbxdp.QUIC{ConfigID: uint8(q.ConfigId), ServerIDLen: uint8(q.ServerIdLength)}
		p.quicIDs = map[string]uint32{}
	}
	if svc.HashMode == lbdv1.HashMode_HASH_MODE_SOURCE_ADDRESS {
		p.svc.HashMode = lbxdp.HashSourceAddr
	}
	if a := svc.SessionAffinity; a != nil {
		p.svc.AffinityTimeout = a.Timeout.AsDuration()
	}
	p.ranges = ms.SourceRanges
	var usable []maglev.Backend
	var entries uint64
	for i, b := range svc.Backends {
		entries += uint64(b.Weight)
		ap, node := ms.Backends[i].Addr, ms.Backends[i].Node
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
		p.backends[b.Id] = lbxdp.Backend{Addr: ap.Addr(), Port: ap.Port(), Node: node}
		p.backendKeys[b.Id] = ap
		// A draining or down backend keeps its server ID, so its QUIC connections go on
		// whatever their client's address; a disabled or removed one is not here.
		if len(b.QuicServerId) > 0 && p.quicIDs != nil {
			p.quicIDs[string(b.QuicServerId)] = b.Id
		}
		reachable := b.NodeReachability != lbdv1.Reachability_REACHABILITY_UNREACHABLE
		if b.State == lbdv1.BackendState_BACKEND_STATE_ACTIVE && !down && reachable {
			usable = append(usable, maglev.Backend{ID: b.Id, Key: maglev.Key(ap), Weight: b.Weight})
		}
	}
	// The size follows the service's backends as configured, whatever their state,
	// so that every LB node derives the same one.
	size := maglev.TableSize(svc.MaglevTableSize, len(svc.Backends), entries)
	if err := maglev.Validate(usable, size); err != nil {
		return nil, fmt.Errorf("service %s: maglev: %w", svc.Name, err)
	}
	if len(usable) > 0 {
		p.table = tableInfo{size: size, digest: maglev.Digest(usable, size), usable: usable, indexes: len(svc.Backends)}
	}
	return &plan{want: p}, nil
}

// Upsert programs one service (Apply with one service).
func (m *Manager) Upsert(ctx context.Context, svc *model.Service) (map[uint32]uint32, error) {
	slots, errs := m.Apply(ctx, nil, []*model.Service{svc})
	return slots[svc.Spec.Id], errs[svc.Spec.Id]
}

// Delete removes one service (Apply with one removal).
func (m *Manager) Delete(ctx context.Context, svc *model.Service) error {
	_, errs := m.Apply(ctx, []*model.Service{svc}, nil)
	return errs[svc.Spec.Id]
}

// Apply implements reconcile.Datapath: it removes deletes, then programs upserts, in
// one batch. Tables are built on every CPU and only where their input changed; new
// table maps are swapped in together (one RCU grace period per batch, not per table);
// learned state (conntrack, affinity) is swept once for the whole batch. A service
// whose change fails is reported by ID and does not stop the others.
func (m *Manager) Apply(_ context.Context, deletes, upserts []*model.Service) (map[uint32]map[uint32]uint32, map[uint32]error) {
	slotsOut := map[uint32]map[uint32]uint32{}
	errs := map[uint32]error{}
	if m.lb == nil {
		return slotsOut, errs
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var sw sweep
	for _, svc := range deletes {
		if err := m.remove(svc.Spec.Id, &sw); err != nil {
			errs[svc.Spec.Id] = err
		}
	}
	plans := make([]*plan, 0, len(upserts))
	for _, svc := range upserts {
		p, err := desired(svc)
		if err != nil {
			errs[svc.Spec.Id] = err
			continue
		}
		plans = append(plans, p)
	}
	m.applyPlans(plans, &sw)
	if err := m.finishSweep(&sw); err != nil {
		for _, p := range plans {
			if p.err == nil {
				p.err = err
			}
		}
		for _, svc := range deletes {
			if errs[svc.Spec.Id] == nil {
				errs[svc.Spec.Id] = err
			}
		}
	}
	for _, p := range plans {
		if p.err != nil {
			errs[p.want.svc.ID] = p.err
		} else {
			slotsOut[p.want.svc.ID] = p.want.table.shares
		}
	}
	return slotsOut, errs
}

// applyPlans moves the maps to the plans, in an order that never lets a packet see a
// table entry without its backend or a service without its table: backends and source
// ranges, then tables, then service entries and removals. A failed plan keeps its error
// and is skipped by the later steps. Caller holds mu.
func (m *Manager) applyPlans(plans []*plan, sw *sweep) {
	for _, p := range plans {
		p.old = m.programmed[p.want.svc.ID]
		if p.old == nil {
			p.old = &programmed{}
		}
	}
	m.writeBefore(plans)
	m.writeTables(plans)
	for _, p := range plans {
		if p.err == nil {
			p.err = m.writeAfter(p.old, p.want, sw)
		}
		if p.err != nil {
			p.err = fmt.Errorf("service %s: %w", p.want.name, p.err)
		}
	}
}

// writeBefore adds what the new tables may refer to: backends (in one batch) and
// source ranges.
func (m *Manager) writeBefore(plans []*plan) {
	backends := map[uint32]lbxdp.Backend{}
	for _, p := range plans {
		for bid, b := range p.want.backends {
			if ob, ok := p.old.backends[bid]; ok && ob == b {
				continue
			}
			// An adopted entry with the right content need not be written again.
			if ob, ok := m.orphans[bid]; !ok || ob != b {
				backends[bid] = b
			}
		}
	}
	if err := m.lb.UpsertBackends(backends); err != nil {
		for _, p := range plans {
			p.err = err
		}
		return
	}
	for _, p := range plans {
		for _, r := range p.want.ranges {
			if !slices.Contains(p.old.ranges, r) {
				if err := m.lb.AddSourceRange(p.want.svc.ID, r); err != nil {
					p.err = err
					break
				}
			}
		}
		if p.err == nil {
			p.err = m.writeQUICIDs(p.old, p.want)
		}
	}
}

// writeQUICIDs adds or changes the QUIC server IDs of want (their backends are in the
// maps by now).
func (m *Manager) writeQUICIDs(old, want *programmed) error {
	for _, sid := range slices.Sorted(maps.Keys(want.quicIDs)) {
		bid := want.quicIDs[sid]
		if ob, ok := old.quicIDs[sid]; ok && ob == bid && old.svc.ID == want.svc.ID {
			continue
		}
		if err := m.lb.SetQUICServerID(want.svc.ID, []byte(sid), bid); err != nil {
			return err
		}
	}
	return nil
}

// deleteQUICIDs removes the server IDs of old that want (nil: none) has not: their
// packets take the 5-tuple path from then on.
func (m *Manager) deleteQUICIDs(old, want *programmed) error {
	for _, sid := range slices.Sorted(maps.Keys(old.quicIDs)) {
		if want != nil {
			if _, ok := want.quicIDs[sid]; ok {
				continue
			}
		}
		if err := m.lb.DeleteQUICServerID(old.svc.ID, []byte(sid)); err != nil {
			return err
		}
	}
	return nil
}

// writeAfter switches the service entry and removes what the old table referred to.
func (m *Manager) writeAfter(old, want *programmed, sw *sweep) error {
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
	// A server ID goes before its backend, so that no packet finds one without the other.
	if err := m.deleteQUICIDs(old, want); err != nil {
		return err
	}
	for bid := range old.backends {
		if _, ok := want.backends[bid]; !ok {
			if err := m.lb.DeleteBackend(bid); err != nil {
				return err
			}
			sw.goneBackends = append(sw.goneBackends, bid)
		}
	}
	if want.svc.AffinityTimeout > 0 && !old.table.has(want.table.size, want.table.digest) {
		// A drained, down, disabled or removed backend keeps its established flows
		// (conntrack), but no new flow may follow affinity to it, as none may reach it
		// through the table.
		sw.affinity(id, want.table.shares)
	}
	m.track(old, -1)
	m.track(want, 1)
	m.programmed[id] = want
	return nil
}

// sweep collects what a batch leaves to clean in learned state, done once per batch
// (each is a pass over a whole map).
type sweep struct {
	goneBackends []uint32
	// keepAffinity: by service ID, the backends whose affinity entries stay (nil: none).
	keepAffinity map[uint32]map[uint32]uint32
}

func (sw *sweep) affinity(serviceID uint32, keep map[uint32]uint32) {
	if sw.keepAffinity == nil {
		sw.keepAffinity = map[uint32]map[uint32]uint32{}
	}
	sw.keepAffinity[serviceID] = keep
}

// finishSweep drops the conntrack entries of removed or disabled backends, so that
// their flows re-balance at their next packet instead of black-holing (a UDP flow moves
// at once), resets their counters, purges affinity, and hands the next-hop tracker the
// backend nodes. Caller holds mu.
func (m *Manager) finishSweep(sw *sweep) error {
	defer m.syncNodes()
	if len(sw.goneBackends) > 0 {
		n, err := m.lb.DeleteConntrackByBackend(sw.goneBackends...)
		if err != nil {
			return err
		}
		for _, bid := range sw.goneBackends {
			if err := m.lb.ResetBackendCounters(bid); err != nil {
				return err
			}
		}
		m.log.Debug("backends removed from the datapath", "op", "reconcile", "backends", len(sw.goneBackends), "flows", n)
	}
	if len(sw.keepAffinity) == 0 {
		return nil
	}
	return m.purgeAffinity(func(svc, be uint32) bool {
		keep, ok := sw.keepAffinity[svc]
		if !ok {
			return false
		}
		_, kept := keep[be]
		return !kept
	})
}

// purgeAffinity drops the affinity entries (XDP and socket-level) for which drop
// says so, in one pass over each map.
func (m *Manager) purgeAffinity(drop func(serviceID, backendID uint32) bool) error {
	entries, err := m.lb.Affinity()
	if err != nil {
		return err
	}
	n := 0
	for _, e := range entries {
		if drop(e.ServiceID, e.BackendID) {
			if err := m.lb.DeleteAffinity(e.ServiceID, e.Client); err != nil {
				return err
			}
			n++
		}
	}
	if m.sock != nil {
		sn, err := m.sock.PurgeAffinity(drop)
		if err != nil {
			return err
		}
		n += sn
	}
	if n > 0 {
		m.log.Debug("affinity purged", "op", "write", "entries", n)
	}
	return nil
}

// remove takes a service out of the maps; what its removal leaves in learned state is
// collected in sw. Removing a service drops all of its affinity entries, so that a
// service that later gets the same ID does not inherit them. Caller holds mu.
func (m *Manager) remove(id uint32, sw *sweep) error {
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
	if err := m.deleteQUICIDs(old, nil); err != nil {
		return err
	}
	for _, bid := range slices.Sorted(maps.Keys(old.backends)) {
		if err := m.lb.DeleteBackend(bid); err != nil {
			return err
		}
		sw.goneBackends = append(sw.goneBackends, bid)
	}
	if err := m.lb.ResetServiceCounters(id); err != nil {
		return err
	}
	sw.affinity(id, nil)
	m.track(old, -1)
	delete(m.programmed, id)
	return nil
}

// Sync implements reconcile.Datapath: it writes what differs between the services and
// the maps (adopted from an earlier daemon, or empty) and removes what is not desired.
// After a restart with equal state it writes nothing: the tables in the maps carry the
// digest of what they were built from, and none is built again.
func (m *Manager) Sync(_ context.Context, svcs []*model.Service) (map[string]map[uint32]uint32, error) {
	out := map[string]map[uint32]uint32{}
	if m.lb == nil {
		return out, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	start, writes := time.Now(), m.lb.Writes()
	keep := make(map[uint32]bool, len(svcs))
	plans := make([]*plan, 0, len(svcs))
	for _, svc := range svcs {
		p, err := desired(svc)
		if err != nil {
			return nil, err
		}
		plans = append(plans, p)
		keep[svc.Spec.Id] = true
	}
	var sw sweep
	for _, id := range slices.Sorted(maps.Keys(m.programmed)) {
		if !keep[id] {
			if err := m.remove(id, &sw); err != nil {
				return nil, fmt.Errorf("remove stale service %d: %w", id, err)
			}
		}
	}
	m.applyPlans(plans, &sw)
	for _, p := range plans {
		if p.err != nil {
			return nil, fmt.Errorf("sync %w", p.err)
		}
		out[p.want.name] = p.want.table.shares
	}
	// Backends left by an earlier daemon that no service refers to any more.
	live := map[uint32]bool{}
	for _, p := range m.programmed {
		for bid := range p.backends {
			live[bid] = true
		}
	}
	for _, bid := range slices.Sorted(maps.Keys(m.orphans)) {
		if !live[bid] {
			if err := m.lb.DeleteBackend(bid); err != nil {
				return nil, err
			}
			sw.goneBackends = append(sw.goneBackends, bid)
		}
	}
	if err := m.finishSweep(&sw); err != nil {
		return nil, err
	}
	m.orphans = nil
	if !m.synced {
		m.synced = true
		close(m.syncedCh)
	}
	m.log.Info("datapath maps synced", "op", "sync", "services", len(svcs),
		"writes", m.lb.Writes()-writes, "took", time.Since(start))
	return out, nil
}

// MapWrites is the number of entries lbd has written to the maps it fills from the
// desired state since Open (lbxdp.Datapath.Writes): a restart that finds the maps as
// they should be adds none.
func (m *Manager) MapWrites() uint64 {
	if m.lb == nil {
		return 0
	}
	return m.lb.Writes()
}
