//go:build linux

package datapath

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"runtime"
	"slices"
	"sync"

	"github.com/lbd-dev/lbd/bpf/lbxdp"
	"github.com/lbd-dev/lbd/daemon/maglev"
)

// Maglev tables live only in the kernel (bpf/lbxdp/tables.go has their layout). The
// manager keeps each one's size, the digest of what it was built from and its shares;
// a table is built again only when that digest changes, which is also how a restarted
// daemon recognises the tables it finds: equal digest and intact slots, nothing to
// write.

// installBatch bounds the new table maps held open before they are swapped in: each is
// a file descriptor until then, and each swap batch costs one RCU grace period.
const installBatch = 4096

// writeTables brings every plan's table to the maps: builds the tables whose input
// changed on every CPU, writes each into its service's map in place when the map fits,
// and swaps in new maps in batches. Caller holds mu.
func (m *Manager) writeTables(plans []*plan) {
	var work []*plan
	for _, p := range plans {
		switch {
		case p.err != nil:
		case p.want.table.size == 0:
			if p.old.table.present {
				p.err = m.lb.DeleteMaglevTable(p.want.svc.ID)
			}
		case p.old.table.has(p.want.table.size, p.want.table.digest):
			p.want.table.shares, p.want.table.present = p.old.table.shares, true
		default:
			work = append(work, p)
		}
	}
	for len(work) > 0 {
		chunk := work[:min(len(work), installBatch)]
		work = work[len(chunk):]
		parallel(len(chunk), func(i int) { m.writeTable(chunk[i]) })
		var pending []*lbxdp.PendingTable
		for _, p := range chunk {
			if p.pending != nil {
				pending = append(pending, p.pending)
			}
		}
		if err := m.lb.InstallTables(pending); err != nil {
			for _, p := range chunk {
				if p.pending != nil {
					p.err = err
				}
			}
		}
		for _, p := range chunk {
			p.pending = nil
		}
	}
}

// writeTable builds a plan's table and writes it: in place when the service's map
// fits it, else into a new map (p.pending) for writeTables to swap in. It runs on
// several goroutines at once, each on its own plan.
func (m *Manager) writeTable(p *plan) {
	want := &p.want.table
	slots, err := maglev.BuildIndexed(want.usable, want.size)
	if err != nil {
		p.err = fmt.Errorf("maglev: %w", err)
		return
	}
	t := lbxdp.Table{Backends: make([]uint32, len(want.usable)), Slots: slots, Digest: want.digest, Indexes: want.indexes}
	for i, b := range want.usable {
		t.Backends[i] = b.ID
	}
	want.shares, want.present = t.Shares(), true
	if p.old.table.size == want.size {
		_, err := m.lb.ChangeTable(p.want.svc.ID, t)
		if !errors.Is(err, lbxdp.ErrTableShape) {
			p.err = err
			return
		}
	}
	p.pending, p.err = m.lb.NewTable(p.want.svc.ID, t)
}

// parallel calls fn(0..n-1) on as many goroutines as there are CPUs.
func parallel(n int, fn func(i int)) {
	workers := min(n, runtime.GOMAXPROCS(0))
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				fn(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

// adoptProgrammed reads what an earlier daemon left in the maps, so that Sync writes
// only the difference: services, source ranges, QUIC server IDs and backends, and of each table its
// size, digest and shares, read on every CPU. A table whose slots do not match the
// checksum its writer recorded is adopted as missing, to be written again.
func (m *Manager) adoptProgrammed() error {
	svcs, err := m.lb.Services()
	if err != nil {
		return err
	}
	ranges, err := m.lb.SourceRanges()
	if err != nil {
		return err
	}
	lens := make(map[uint32]uint8, len(svcs))
	for _, s := range svcs {
		lens[s.ID] = s.QUIC.ServerIDLen
	}
	quicIDs, err := m.lb.QUICServerIDs(lens)
	if err != nil {
		return err
	}
	adopted := make([]*programmed, 0, len(svcs))
	for k, s := range svcs {
		p := &programmed{key: k, svc: s, ranges: ranges[s.ID], quicIDs: quicIDs[s.ID],
			backends: map[uint32]lbxdp.Backend{}, backendKeys: map[uint32]netip.AddrPort{}}
		adopted = append(adopted, p)
		m.programmed[s.ID] = p
	}
	errs := make([]error, len(adopted))
	parallel(len(adopted), func(i int) {
		p := adopted[i]
		st, err := m.lb.ReadTable(p.svc.ID)
		switch {
		case err != nil:
			errs[i] = err
		case st == nil:
		case !st.Intact:
			p.table.present = true
		default:
			p.table = tableInfo{size: uint32(len(st.Slots)), digest: st.Digest, shares: st.Shares(), present: true}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return err
	}
	m.orphans, err = m.lb.Backends()
	return err
}

// verifyTableBatch is how many Maglev tables a periodic verification reads, the next
// ones each time, so that its cost stays bounded whatever the number of services:
// every table is read at least once in ceil(services / verifyTableBatch) intervals.
const verifyTableBatch = 1000

// verifyTables reads tables back (all of them, or the next verifyTableBatch) and
// rewrites, in new maps, those that are missing, not of the size or digest they were
// written with, or whose slots do not match their checksum. Caller holds mu.
func (m *Manager) verifyTables(note func(kind, format string, args ...any), all bool) error {
	ids := slices.Sorted(maps.Keys(m.programmed))
	if !all && len(ids) > verifyTableBatch {
		i, _ := slices.BinarySearch(ids, m.verifyNext)
		ids = append(ids[i:], ids[:i]...)[:verifyTableBatch]
		m.verifyNext = ids[len(ids)-1] + 1
	}
	bad := make([]string, len(ids))
	errs := make([]error, len(ids))
	parallel(len(ids), func(i int) {
		t := m.programmed[ids[i]].table
		st, err := m.lb.ReadTable(ids[i])
		switch {
		case err != nil:
			errs[i] = err
		case st == nil && t.size != 0:
			bad[i] = "missing"
		case st != nil && t.size == 0:
			bad[i] = "present without a usable backend"
		case st == nil:
		case !st.Intact:
			bad[i] = "slots that do not match their checksum"
		case uint32(len(st.Slots)) != t.size || st.Digest != t.digest:
			bad[i] = fmt.Sprintf("%d slots built from %#x, want %d from %#x", len(st.Slots), st.Digest, t.size, t.digest)
		}
	})
	if err := errors.Join(errs...); err != nil {
		return err
	}
	var plans []*plan
	for i, why := range bad {
		if why == "" {
			continue
		}
		p := m.programmed[ids[i]]
		note("maglev_table", "Maglev table of service %s: %s: rewritten", p.name, why)
		if p.table.size == 0 {
			if err := m.lb.DeleteMaglevTable(ids[i]); err != nil {
				return err
			}
			continue
		}
		plans = append(plans, &plan{want: p, old: &programmed{}})
	}
	m.writeTables(plans)
	for _, p := range plans {
		if p.err != nil {
			return fmt.Errorf("rewrite the Maglev table of service %s: %w", p.want.name, p.err)
		}
	}
	return nil
}
