//go:build linux

package lbxdp

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/cilium/ebpf"
)

// A service's table map has 2M+1 slots: slot 0 holds M and, in its top bit, which half
// is active; slots 1..M are half 0 and M+1..2M half 1. A change writes the inactive half,
// flips slot 0 (one 4-byte store, atomic for the datapath), then brings the other half
// up to date, so both halves hold the current table between changes and the next change
// only writes the slots that differ. Only a new service or a new size replaces the map
// itself, which costs an RCU grace period in the kernel.
const tableHalfBit = 1 << 31

// SetMaglevTables swaps in new table maps for several services at once (service ID →
// table). The swaps go to the kernel in one batch: the kernel waits for an RCU grace
// period after every update of a map of maps, so one batch costs one wait instead of
// one per service. Each service switches from its old table to its new one atomically.
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

// UpdateMaglevTable changes a service's table from old (what the datapath holds, as
// MaglevTable returns it) to table, writing only the slots that differ, without
// replacing the map. When the service has no table map of that size yet it falls back
// to SetMaglevTable.
func (d *Datapath) UpdateMaglevTable(serviceID uint32, old, table []uint32) error {
	if len(old) == 0 || len(old) != len(table) {
		return d.SetMaglevTable(serviceID, table)
	}
	inner, err := d.tableMap(serviceID)
	if err != nil {
		return err
	}
	if inner == nil {
		return d.SetMaglevTable(serviceID, table)
	}
	defer inner.Close()
	m := uint32(len(table))
	if inner.MaxEntries() != 2*m+1 {
		return d.SetMaglevTable(serviceID, table)
	}
	var head uint32
	if err := inner.Lookup(uint32(0), &head); err != nil {
		return fmt.Errorf("update maglev table: %w", err)
	}
	if head&^tableHalfBit != m {
		return d.SetMaglevTable(serviceID, table)
	}
	var slots, vals []uint32
	for i := range table {
		if table[i] != old[i] {
			slots = append(slots, uint32(i))
			vals = append(vals, table[i])
		}
	}
	if len(slots) == 0 {
		return nil
	}
	active := head >> 31
	write := func(half uint32) error {
		keys := make([]uint32, len(slots))
		for i, s := range slots {
			keys[i] = 1 + half*m + s
		}
		if _, err := inner.BatchUpdate(keys, vals, nil); err != nil {
			return fmt.Errorf("update maglev table: %w", err)
		}
		return nil
	}
	if err := write(1 - active); err != nil {
		return err
	}
	if err := inner.Update(uint32(0), (1-active)<<31|m, ebpf.UpdateExist); err != nil {
		return fmt.Errorf("update maglev table: flip: %w", err)
	}
	return write(active)
}

// tableMap opens a service's current table map, nil if it has none.
func (d *Datapath) tableMap(serviceID uint32) (*ebpf.Map, error) {
	var id ebpf.MapID
	if err := d.objs.LbMaglev.Lookup(serviceID, &id); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("look up maglev table: %w", err)
	}
	m, err := ebpf.NewMapFromID(id)
	if err != nil {
		return nil, fmt.Errorf("open maglev table: %w", err)
	}
	return m, nil
}

// newTable builds a service's table map with half 0 active and both halves filled.
func (d *Datapath) newTable(serviceID uint32, table []uint32) (*ebpf.Map, error) {
	if serviceID >= d.opts.MaxServices {
		return nil, fmt.Errorf("set maglev table: service ID %d: %w", serviceID, ErrRange)
	}
	if len(table) == 0 || len(table) > MaxTableSize {
		return nil, fmt.Errorf("set maglev table: size %d: %w", len(table), ErrRange)
	}
	m := len(table)
	spec := d.maglevInner.Copy()
	spec.MaxEntries = uint32(2*m + 1)
	inner, err := ebpf.NewMap(spec)
	if err != nil {
		return nil, fmt.Errorf("set maglev table: create table: %w", err)
	}
	keys := make([]uint32, 2*m+1)
	vals := make([]uint32, 2*m+1)
	for i := range keys {
		keys[i] = uint32(i)
	}
	vals[0] = uint32(m)
	copy(vals[1:], table)
	copy(vals[1+m:], table)
	if _, err := inner.BatchUpdate(keys, vals, nil); err != nil {
		inner.Close()
		return nil, fmt.Errorf("set maglev table: fill table: %w", err)
	}
	return inner, nil
}
