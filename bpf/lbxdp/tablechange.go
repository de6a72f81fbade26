//go:build linux

package lbxdp

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
)

// ChangeTable changes a service's table in its current map, writing the backend
// indexes and slots of the inactive half that differ, then flipping the head. It
// returns how many elements it wrote, or an error wrapping ErrTableShape when the map
// cannot take t (NewTable and InstallTables then can).
func (d *Datapath) ChangeTable(serviceID uint32, t Table) (int, error) {
	for _, x := range t.Slots {
		if int(x) >= len(t.Backends) {
			return 0, fmt.Errorf("change maglev table: index %d of %d backends: %w", x, len(t.Backends), ErrRange)
		}
	}
	inner, err := d.tableMap(serviceID)
	if err != nil {
		return 0, err
	}
	if inner == nil {
		return 0, fmt.Errorf("change maglev table: service %d has none: %w", serviceID, ErrTableShape)
	}
	defer inner.Close()
	elems, err := readElems(inner)
	if err != nil {
		return 0, fmt.Errorf("change maglev table: %w", err)
	}
	h := parseHead(elems[0])
	m := uint32(len(t.Slots))
	if !h.fits(uint32(len(elems))) || h.m() != m {
		return 0, fmt.Errorf("change maglev table: size %d, map holds %d: %w", m, h.m(), ErrTableShape)
	}
	ids := make([]uint32, h.idElems*idsPerElem)
	for i := range ids {
		ids[i] = elems[1+i/idsPerElem][i%idsPerElem]
	}
	to, writes, err := assignIndexes(ids, elems, h, t.Backends)
	if err != nil {
		return 0, err
	}
	keys := slices.Clone(writes)
	vals := make([]tableElem, 0, len(writes))
	for _, e := range writes {
		vals = append(vals, elems[e])
	}
	next := 1 - h.active()
	start := h.halfStart(next)
	for c := range (m + slotsPerElem - 1) / slotsPerElem {
		e := elems[start+c]
		for i := c * slotsPerElem; i < min(m, (c+1)*slotsPerElem); i++ {
			setSlot(&e, i, uint16(to[t.Slots[i]]))
		}
		if e != elems[start+c] {
			keys = append(keys, start+c)
			vals = append(vals, e)
		}
	}
	if len(keys) > 0 {
		if _, err := inner.BatchUpdate(keys, vals, nil); err != nil {
			return 0, fmt.Errorf("change maglev table: write: %w", err)
		}
	}
	top := 0
	for _, i := range to {
		top = max(top, i+1)
	}
	head := tableHead{size: next<<31 | m, idElems: h.idElems, backends: uint32(top), digest: t.Digest,
		checksum: t.Checksum(), layout: tableLayout}
	if err := inner.Update(uint32(0), head.elem(), ebpf.UpdateExist); err != nil {
		return 0, fmt.Errorf("change maglev table: flip: %w", err)
	}
	written := len(keys) + 1
	d.writes.Add(uint64(written))
	return written, nil
}

// assignIndexes maps each of backends to an index of the map's list ids: the one that
// holds it already, else one that the active half does not use and no other backend of
// the new table holds. It writes new entries into elems and returns the indexes by
// position in backends and the elements of the list that changed.
func assignIndexes(ids []uint32, elems []tableElem, h tableHead, backends []uint32) ([]int, []uint32, error) {
	used := make([]bool, len(ids))
	start := h.halfStart(h.active())
	for i := range h.m() {
		if s := slotOf(elems, start, i); int(s) < len(used) {
			used[s] = true
		}
	}
	at := make(map[uint32]int, len(ids))
	for i, id := range ids {
		if _, ok := at[id]; !ok && id != 0 {
			at[id] = i
		}
	}
	to := make([]int, len(backends))
	for b, id := range backends {
		to[b] = -1
		if i, ok := at[id]; ok {
			to[b], used[i] = i, true
		}
	}
	free := 0
	var writes []uint32
	for b, id := range backends {
		if to[b] >= 0 {
			continue
		}
		for free < len(ids) && used[free] {
			free++
		}
		if free == len(ids) {
			return nil, nil, fmt.Errorf("change maglev table: more backends than the map's %d indexes: %w", len(ids), ErrTableShape)
		}
		to[b], used[free] = free, true
		e := uint32(1 + free/idsPerElem)
		elems[e][free%idsPerElem] = id
		if !slices.Contains(writes, e) {
			writes = append(writes, e)
		}
	}
	return to, writes, nil
}

// ReadTable returns what a service's table map holds, nil if it has none.
func (d *Datapath) ReadTable(serviceID uint32) (*TableState, error) {
	var id ebpf.MapID
	if err := d.objs.LbTables.Lookup(serviceID, &id); errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("read maglev table: %w", err)
	}
	inner, err := ebpf.NewMapFromID(id)
	if err != nil {
		return nil, fmt.Errorf("read maglev table: %w", err)
	}
	defer inner.Close()
	st := &TableState{MapID: id}
	elems, err := readActive(inner)
	if err != nil {
		return nil, fmt.Errorf("read maglev table: %w", err)
	}
	h := parseHead(elems[0])
	if !h.fits(inner.MaxEntries()) {
		return st, nil
	}
	st.Digest, st.Checksum = h.digest, h.checksum
	st.Backends = make([]uint32, h.idElems*idsPerElem)
	for i := range st.Backends {
		st.Backends[i] = elems[1+i/idsPerElem][i%idsPerElem]
	}
	m := h.m()
	st.Slots = make([]uint16, m)
	start := h.halfStart(h.active())
	ok := true
	for i := range m {
		st.Slots[i] = slotOf(elems, start, i)
		ok = ok && int(st.Slots[i]) < len(st.Backends) && st.Backends[st.Slots[i]] != 0
	}
	st.Intact = ok && st.Table.Checksum() == h.checksum
	return st, nil
}

// MaglevTable returns the backend ID of each slot of the table the datapath uses for
// a service, nil if none.
func (d *Datapath) MaglevTable(serviceID uint32) ([]uint32, error) {
	st, err := d.ReadTable(serviceID)
	if err != nil || st == nil {
		return nil, err
	}
	if st.Slots == nil {
		return nil, fmt.Errorf("read maglev table of service %d: not a table of this layout", serviceID)
	}
	return st.IDs(), nil
}
