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
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// DefaultVerifyInterval is how often RunVerify reads the datapath back.
const DefaultVerifyInterval = 5 * time.Second

func (m *Manager) verifyInterval() time.Duration {
	if m.cfg.VerifyInterval > 0 {
		return m.cfg.VerifyInterval
	}
	return DefaultVerifyInterval
}

// RunVerify calls Verify every verify interval until ctx ends.
func (m *Manager) RunVerify(ctx context.Context) {
	t := time.NewTicker(m.verifyInterval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		drift, err := m.verify(false)
		if err != nil {
			m.log.Error("datapath verification failed", "op", "verify", "error", err)
			continue
		}
		m.log.Debug("datapath verified", "op", "verify", "repaired", len(drift), "took", time.Since(start))
	}
}

// Verify reads the maps and attachments back, compares them with what this daemon
// wrote (the desired state), and repairs every difference: something other than lbd
// changed a map entry, removed one, or detached a program. Each repair is logged with
// what differed and counted by kind (DriftCounts). A node detached on purpose
// (Detach) is left detached. It reads every Maglev table; the periodic verification
// reads verifyTableBatch of them each time, in turn.
func (m *Manager) Verify(context.Context) ([]*lbdv1.Drift, error) { return m.verify(true) }

func (m *Manager) verify(allTables bool) ([]*lbdv1.Drift, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.attached {
		return nil, nil
	}
	var out []*lbdv1.Drift
	note := func(kind, format string, args ...any) {
		d := &lbdv1.Drift{Kind: kind, Description: fmt.Sprintf(format, args...)}
		out = append(out, d)
		m.drift[kind]++
		m.log.Warn("datapath drift repaired", "op", "verify", "kind", kind, "what", d.Description)
	}
	gone, err := m.detachedLinks()
	if err != nil {
		return out, err
	}
	for _, name := range gone {
		if err := m.reattach(name); err != nil {
			return out, err
		}
		note("attachment", "link %s was detached from its interface: attached again", name)
	}
	changed, err := m.cfg.applySysctls()
	for _, c := range changed {
		note("sysctl", "%s (set again)", c)
	}
	if err != nil {
		return out, err
	}
	if m.lb != nil && m.synced {
		if err := m.verifyLB(note, allTables); err != nil {
			return out, err
		}
	}
	if m.be != nil {
		if err := m.verifyBackend(note); err != nil {
			return out, err
		}
	}
	return out, nil
}

// verifyLB compares the LB maps with m.programmed and m.lbConfig. Caller holds mu.
func (m *Manager) verifyLB(note func(kind, format string, args ...any), allTables bool) error {
	c, err := m.lb.Config()
	if err != nil {
		return err
	}
	if c != m.lbConfig {
		if err := m.lb.SetConfig(m.lbConfig); err != nil {
			return err
		}
		note("config", "datapath configuration %+v, want %+v", c, m.lbConfig)
	}

	have, err := m.lb.Services()
	if err != nil {
		return err
	}
	want := map[uint32]bool{}
	for _, id := range slices.Sorted(maps.Keys(m.programmed)) {
		p := m.programmed[id]
		want[id] = true
		if s, ok := have[p.key]; !ok || s != p.svc {
			if err := m.lb.UpsertService(p.key, p.svc); err != nil {
				return err
			}
			note("service", "service %s (%s): %s", p.name, keyString(p.key), presence(ok, fmt.Sprintf("%+v, want %+v", s, p.svc)))
		}
	}
	for k, s := range have {
		if p := m.programmed[s.ID]; p == nil || p.key != k {
			if err := m.lb.DeleteService(k); err != nil {
				return err
			}
			note("service", "service %s with ID %d is not desired: removed", keyString(k), s.ID)
		}
	}
	diffs, err := m.lb.VerifyIndexes()
	if err != nil {
		return err
	}
	for _, d := range diffs {
		note("service_index", "%s", d)
	}

	backends, err := m.lb.Backends()
	if err != nil {
		return err
	}
	live := map[uint32]bool{}
	for _, id := range slices.Sorted(maps.Keys(m.programmed)) {
		p := m.programmed[id]
		for bid, b := range p.backends {
			live[bid] = true
			if got, ok := backends[bid]; !ok || got != b {
				if err := m.lb.UpsertBackend(bid, b); err != nil {
					return err
				}
				note("backend", "backend %d of service %s: %s", bid, p.name, presence(ok, fmt.Sprintf("%+v, want %+v", got, b)))
			}
		}
	}
	if err := m.verifyTables(note, allTables); err != nil {
		return err
	}
	for bid := range backends {
		if !live[bid] {
			if err := m.lb.DeleteBackend(bid); err != nil {
				return err
			}
			note("backend", "backend %d is not desired: removed", bid)
		}
	}

	if err := m.verifyQUICIDs(note); err != nil {
		return err
	}
	ranges, err := m.lb.SourceRanges()
	if err != nil {
		return err
	}
	for id, p := range m.programmed {
		for _, r := range p.ranges {
			if !slices.Contains(ranges[id], r) {
				if err := m.lb.AddSourceRange(id, r); err != nil {
					return err
				}
				note("source_range", "source range %s of service %s was missing", r, p.name)
			}
		}
	}
	for id, rs := range ranges {
		p := m.programmed[id]
		for _, r := range rs {
			if p == nil || !slices.Contains(p.ranges, r) {
				if err := m.lb.DeleteSourceRange(id, r); err != nil {
					return err
				}
				note("source_range", "source range %s of service ID %d is not desired: removed", r, id)
			}
		}
	}
	return nil
}

// verifyQUICIDs compares the QUIC server IDs in the map with those of the programmed
// services. Caller holds mu.
func (m *Manager) verifyQUICIDs(note func(kind, format string, args ...any)) error {
	lens := make(map[uint32]uint8, len(m.programmed))
	for id, p := range m.programmed {
		lens[id] = p.svc.QUIC.ServerIDLen
	}
	have, err := m.lb.QUICServerIDs(lens)
	if err != nil {
		return err
	}
	for _, id := range slices.Sorted(maps.Keys(m.programmed)) {
		p := m.programmed[id]
		for _, sid := range slices.Sorted(maps.Keys(p.quicIDs)) {
			bid := p.quicIDs[sid]
			if got, ok := have[id][sid]; !ok || got != bid {
				if err := m.lb.SetQUICServerID(id, []byte(sid), bid); err != nil {
					return err
				}
				note("quic_server_id", "QUIC server ID %x of service %s: %s", sid, p.name, presence(ok, fmt.Sprintf("backend %d, want %d", got, bid)))
			}
		}
	}
	for id, sids := range have {
		for sid := range sids {
			if p := m.programmed[id]; p == nil || p.quicIDs[sid] == 0 {
				if err := m.lb.DeleteQUICServerID(id, []byte(sid)); err != nil {
					return err
				}
				note("quic_server_id", "QUIC server ID %x of service ID %d is not desired: removed", sid, id)
			}
		}
	}
	return nil
}

// verifyBackend compares the backend role's configuration and allowed LB sources.
// Caller holds mu.
func (m *Manager) verifyBackend(note func(kind, format string, args ...any)) error {
	c, err := m.be.Config()
	if err != nil {
		return err
	}
	if c.VNI != m.cfg.VNI {
		was := c.VNI
		c.VNI = m.cfg.VNI
		if err := m.be.SetConfig(c); err != nil {
			return err
		}
		note("config", "backend VNI was %d, want %d", was, m.cfg.VNI)
	}
	have, err := m.be.AllowedSources()
	if err != nil {
		return err
	}
	want := make([]netip.Prefix, 0, len(m.cfg.LBSources))
	for _, p := range m.cfg.LBSources {
		want = append(want, p.Masked())
	}
	slices.SortFunc(have, comparePrefix)
	slices.SortFunc(want, comparePrefix)
	if !slices.Equal(slices.Compact(have), slices.Compact(want)) {
		if err := m.syncLBSources(); err != nil {
			return err
		}
		note("lb_sources", "allowed LB sources %v, want %v", have, want)
	}
	return nil
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// DriftCounts returns the repairs Verify made since start, by kind.
func (m *Manager) DriftCounts() map[string]uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.drift)
}

func keyString(k lbxdp.ServiceKey) string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(k.VIP, k.Port), protoName(k.Proto))
}

func presence(ok bool, diff string) string {
	if !ok {
		return "missing"
	}
	return diff
}
