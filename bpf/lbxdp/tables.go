//go:build linux

package lbxdp

import (
	"fmt"
	"maps"
	"slices"

	"github.com/cilium/ebpf"
)

// SetMaglevTables swaps in new tables for several services at once (service ID →
// table). Each table is built aside and the swaps go to the kernel in one batch: the
// kernel waits for an RCU grace period after every update of a map of maps, so one
// batch costs one wait instead of one per service. Each service still switches from its
// old table to its new one atomically.
func (d *Datapath) SetMaglevTables(tables map[uint32][]uint32) error {
	ids := slices.Sorted(maps.Keys(tables))
	inners := make([]*ebpf.Map, 0, len(ids))
	defer func() {
		for _, m := range inners {
			m.Close()
		}
	}()
	fds := make([]uint32, 0, len(ids))
	for _, id := range ids {
		inner, err := d.newTable(id, tables[id])
		if err != nil {
			return err
		}
		inners = append(inners, inner)
		fds = append(fds, uint32(inner.FD()))
	}
	if len(ids) == 0 {
		return nil
	}
	if _, err := d.objs.LbMaglev.BatchUpdate(ids, fds, nil); err != nil {
		return fmt.Errorf("set maglev tables: swap %d tables: %w", len(ids), err)
	}
	return nil
}

// newTable builds a service's table map: slot 0 holds the size M, slots 1..M the
// backend IDs.
func (d *Datapath) newTable(serviceID uint32, table []uint32) (*ebpf.Map, error) {
	if serviceID >= d.opts.MaxServices {
		return nil, fmt.Errorf("set maglev table: service ID %d: %w", serviceID, ErrRange)
	}
	if len(table) == 0 || len(table) > MaxTableSize {
		return nil, fmt.Errorf("set maglev table: size %d: %w", len(table), ErrRange)
	}
	spec := d.maglevInner.Copy()
	spec.MaxEntries = uint32(len(table)) + 1
	inner, err := ebpf.NewMap(spec)
	if err != nil {
		return nil, fmt.Errorf("set maglev table: create table: %w", err)
	}
	keys := make([]uint32, len(table)+1)
	vals := make([]uint32, len(table)+1)
	for i := range keys {
		keys[i] = uint32(i)
	}
	vals[0] = uint32(len(table))
	copy(vals[1:], table)
	if _, err := inner.BatchUpdate(keys, vals, nil); err != nil {
		inner.Close()
		return nil, fmt.Errorf("set maglev table: fill table: %w", err)
	}
	return inner, nil
}
