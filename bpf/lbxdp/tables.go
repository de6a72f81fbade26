//go:build linux

package lbxdp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"

	"github.com/cilium/ebpf"
)

// A service's table is one array map of 64-byte elements (lbstate.h):
//
//	element 0          head: M (top bit: the second half is active), I, and what the
//	                   daemon keeps about the table (tableHead)
//	elements 1..I      the backend IDs the slots refer to, 16 per element
//	then two halves    of S = ceil(M/32) elements, 32 two-byte slots each
//
// A slot holds an index into the backend IDs, so a table costs about 4 bytes per slot
// for both halves together, whatever the backend IDs are. An index keeps its backend
// while the active half refers to it: a change gives new backends indexes that the
// active half does not use, writes them, writes the inactive half, then flips the head
// (one element; only the half bit of the word the programs read changes, so a torn read
// still gives the old or the new half). The half that was active is written only at
// the next change, by then long unread. Only a new service, a new size or more backends
// than the map has indexes for replace the map itself, which costs an RCU grace period
// in the kernel.
const (
	tableHalfBit = 1 << 31
	// TableElemBytes is the size of a table map's elements.
	TableElemBytes = 64
	slotsPerElem   = 32
	idsPerElem     = 16
	// tableLayout is kept in every head: a table of another layout is never read as
	// this one.
	tableLayout = 1
)

type tableElem [idsPerElem]uint32

// ErrTableShape reports that a service's table map cannot take a table in place:
// there is none, its size differs, or it has no free index for a new backend.
var ErrTableShape = errors.New("table map does not fit the table")

// Table is a service's Maglev table as the datapath stores it.
type Table struct {
	// Slots holds the backend ID of each slot; its length is the table size M.
	Slots []uint32
	// Digest identifies what the table was built from. The datapath keeps it in the
	// map, so that a restarted daemon can tell whether the table it finds is the one
	// it would build, without building it.
	Digest uint64
	// Backends is how many backend indexes a new map gets: at least the distinct
	// IDs in Slots (fewer are raised to that). A later table with more distinct
	// backends than the map has indexes needs a new map.
	Backends int
}

// TableState is what a service's table map holds.
type TableState struct {
	// Slots is the active half, as backend IDs.
	Slots []uint32
	// Digest and Checksum are what the writer recorded: the table's Digest and the
	// checksum of its slots.
	Digest, Checksum uint64
	// Intact reports that the active half matches Checksum and every slot refers to
	// a backend index in use.
	Intact bool
	// Backends is the number of backend indexes of the map.
	Backends int
	// MapID identifies the map (it changes when the map is replaced).
	MapID ebpf.MapID
}

// TableMemlock is the kernel memory (memlock) of a table map of size m with room for
// backends indexes: its elements and the kernel's own part of an array map, measured
// at Load.
func (d *Datapath) TableMemlock(m uint32, backends int) uint64 {
	return d.tableHeader + uint64(TableElems(m, backends))*TableElemBytes
}

// measureTableHeader creates a one-element table map to learn what the kernel charges
// for an array map besides its elements (struct bpf_array, which varies by kernel).
func (d *Datapath) measureTableHeader() error {
	spec := d.maglevInner.Copy()
	spec.MaxEntries = 1
	m, err := ebpf.NewMap(spec)
	if err != nil {
		return fmt.Errorf("measure a table map: %w", err)
	}
	defer m.Close()
	info, err := m.Info()
	if err != nil {
		return fmt.Errorf("measure a table map: %w", err)
	}
	n, ok := info.Memlock()
	if !ok || n < TableElemBytes {
		return fmt.Errorf("measure a table map: the kernel reports no memlock")
	}
	d.tableHeader = n - TableElemBytes
	return nil
}

// TableElems is the number of elements of a table map of size m with room for
// backends indexes; TableElemBytes each.
func TableElems(m uint32, backends int) uint32 {
	ids, half := tableShape(m, backends)
	return 1 + ids + 2*half
}

func tableShape(m uint32, backends int) (idElems, halfElems uint32) {
	return uint32(max(backends, 1)+idsPerElem-1) / idsPerElem, (m + slotsPerElem - 1) / slotsPerElem
}

// TableChecksum is the checksum of a table's slots that its map's head records.
func TableChecksum(slots []uint32) uint64 {
	h := fnv.New64a()
	var b [4]byte
	for _, id := range slots {
		binary.LittleEndian.PutUint32(b[:], id)
		h.Write(b[:])
	}
	return h.Sum64()
}

// tableHead is element 0. The programs read size and idElems only.
type tableHead struct {
	size, idElems    uint32 // size with the half bit
	backends         uint32 // indexes in use (the highest one used, plus one)
	digest, checksum uint64
	layout           uint32
}

func (h tableHead) elem() tableElem {
	return tableElem{h.size, h.idElems, h.backends, h.layout,
		uint32(h.digest), uint32(h.digest >> 32), uint32(h.checksum), uint32(h.checksum >> 32)}
}

func parseHead(e tableElem) tableHead {
	return tableHead{size: e[0], idElems: e[1], backends: e[2], layout: e[3],
		digest: uint64(e[4]) | uint64(e[5])<<32, checksum: uint64(e[6]) | uint64(e[7])<<32}
}

func (h tableHead) m() uint32 { return h.size &^ tableHalfBit }

// halfStart is the first element of half (0 or 1).
func (h tableHead) halfStart(half uint32) uint32 {
	return 1 + h.idElems + half*((h.m()+slotsPerElem-1)/slotsPerElem)
}

func (h tableHead) active() uint32 { return h.size >> 31 }

func slotOf(elems []tableElem, start, i uint32) uint16 {
	w := elems[start+i/slotsPerElem][(i%slotsPerElem)/2]
	return uint16(w >> (16 * (i % 2)))
}

func setSlot(e *tableElem, i uint32, v uint16) {
	w := &e[(i%slotsPerElem)/2]
	shift := 16 * (i % 2)
	*w = *w&^(0xffff<<shift) | uint32(v)<<shift
}

// PendingTable is a table map filled by NewTable and not yet in use.
type PendingTable struct {
	serviceID uint32
	m         *ebpf.Map
}

// Close releases a table that was not installed.
func (p *PendingTable) Close() { p.m.Close() }

// NewTable creates and fills a table map for a service, with the first half active;
// InstallTables puts it in use. It is safe for concurrent use, also with the other
// methods.
func (d *Datapath) NewTable(serviceID uint32, t Table) (*PendingTable, error) {
	if serviceID >= d.opts.MaxServices {
		return nil, fmt.Errorf("new maglev table: service ID %d: %w", serviceID, ErrRange)
	}
	m := uint32(len(t.Slots))
	if m == 0 || m > MaxTableSize {
		return nil, fmt.Errorf("new maglev table: size %d: %w", m, ErrRange)
	}
	var ids []uint32
	index := map[uint32]uint16{}
	for _, id := range t.Slots {
		if _, ok := index[id]; !ok {
			if len(ids) > 0xffff {
				return nil, fmt.Errorf("new maglev table: more than %d backends: %w", 0xffff+1, ErrRange)
			}
			index[id] = uint16(len(ids))
			ids = append(ids, id)
		}
	}
	idElems, halfElems := tableShape(m, max(t.Backends, len(ids)))
	n := 1 + idElems + 2*halfElems
	elems := make([]tableElem, n)
	h := tableHead{size: m, idElems: idElems, backends: uint32(len(ids)), digest: t.Digest,
		checksum: TableChecksum(t.Slots), layout: tableLayout}
	elems[0] = h.elem()
	for i, id := range ids {
		elems[1+i/idsPerElem][i%idsPerElem] = id
	}
	for half := range uint32(2) {
		start := h.halfStart(half)
		for i, id := range t.Slots {
			setSlot(&elems[start+uint32(i)/slotsPerElem], uint32(i), index[id])
		}
	}
	spec := d.maglevInner.Copy()
	spec.MaxEntries = n
	inner, err := ebpf.NewMap(spec)
	if err != nil {
		return nil, fmt.Errorf("new maglev table: create map: %w", err)
	}
	keys := make([]uint32, n)
	for i := range keys {
		keys[i] = uint32(i)
	}
	if _, err := inner.BatchUpdate(keys, elems, nil); err != nil {
		inner.Close()
		return nil, fmt.Errorf("new maglev table: fill map: %w", err)
	}
	d.writes.Add(uint64(n))
	return &PendingTable{serviceID: serviceID, m: inner}, nil
}

// InstallTables puts new table maps in use, each replacing its service's map
// atomically, and closes them. The kernel waits for an RCU grace period after every
// update of a map of maps, so they go in one batch: one wait instead of one per table.
func (d *Datapath) InstallTables(tables []*PendingTable) error {
	defer func() {
		for _, t := range tables {
			t.Close()
		}
	}()
	if len(tables) == 0 {
		return nil
	}
	ids := make([]uint32, len(tables))
	fds := make([]uint32, len(tables))
	for i, t := range tables {
		ids[i], fds[i] = t.serviceID, uint32(t.m.FD())
	}
	if _, err := d.objs.LbMaglev.BatchUpdate(ids, fds, nil); err != nil {
		return fmt.Errorf("install %d maglev tables: %w", len(tables), err)
	}
	d.writes.Add(uint64(len(tables)))
	return nil
}

// SetMaglevTables gives several services new tables of backend IDs at once (service
// ID → table), each in a new map.
func (d *Datapath) SetMaglevTables(tables map[uint32][]uint32) error {
	pending := make([]*PendingTable, 0, len(tables))
	for _, id := range slices.Sorted(maps.Keys(tables)) {
		p, err := d.NewTable(id, Table{Slots: tables[id]})
		if err != nil {
			for _, p := range pending {
				p.Close()
			}
			return err
		}
		pending = append(pending, p)
	}
	return d.InstallTables(pending)
}

// SetMaglevTable gives a service a new Maglev table of backend IDs (its length is the
// table size M) in a new map, swapped in with one update: a packet sees either the old
// table or the new one, never a mix.
func (d *Datapath) SetMaglevTable(serviceID uint32, table []uint32) error {
	return d.SetMaglevTables(map[uint32][]uint32{serviceID: table})
}

// ChangeTable changes a service's table in its current map, writing the backend
// indexes and slots of the inactive half that differ, then flipping the head. It
// returns how many elements it wrote, or an error wrapping ErrTableShape when the map
// cannot take t (NewTable and InstallTables then can).
func (d *Datapath) ChangeTable(serviceID uint32, t Table) (int, error) {
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
	if h.layout != tableLayout || h.m() != m || uint32(len(elems)) != 1+h.idElems+2*((m+slotsPerElem-1)/slotsPerElem) {
		return 0, fmt.Errorf("change maglev table: size %d, map holds %d: %w", m, h.m(), ErrTableShape)
	}
	ids := make([]uint32, h.idElems*idsPerElem)
	for i := range ids {
		ids[i] = elems[1+i/idsPerElem][i%idsPerElem]
	}
	// Indexes the active half uses keep their backend; the others are free unless
	// they already hold a backend of the new table.
	used := make([]bool, len(ids))
	start := h.halfStart(h.active())
	for i := range m {
		if s := slotOf(elems, start, i); int(s) < len(used) {
			used[s] = true
		}
	}
	want := map[uint32]int{}
	for _, id := range t.Slots {
		want[id] = -1
	}
	for i, id := range ids {
		if w, ok := want[id]; ok && w < 0 {
			want[id] = i
		}
	}
	free := 0
	var idWrites []uint32 // elements of the ID list to write
	for _, id := range t.Slots {
		if want[id] >= 0 {
			continue
		}
		for free < len(ids) && (used[free] || wantedAt(want, ids[free], free)) {
			free++
		}
		if free == len(ids) {
			return 0, fmt.Errorf("change maglev table: more backends than the map's %d indexes: %w", len(ids), ErrTableShape)
		}
		ids[free], want[id], used[free] = id, free, true
		e := uint32(1 + free/idsPerElem)
		elems[e][free%idsPerElem] = id
		if !slices.Contains(idWrites, e) {
			idWrites = append(idWrites, e)
		}
	}
	top := uint32(0)
	for _, i := range want {
		top = max(top, uint32(i)+1)
	}
	next := 1 - h.active()
	start = h.halfStart(next)
	var keys []uint32
	var vals []tableElem
	keys = append(keys, idWrites...)
	for _, e := range idWrites {
		vals = append(vals, elems[e])
	}
	for c := range (m + slotsPerElem - 1) / slotsPerElem {
		e := elems[start+c]
		for i := c * slotsPerElem; i < min(m, (c+1)*slotsPerElem); i++ {
			setSlot(&e, i, uint16(want[t.Slots[i]]))
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
	head := tableHead{size: next<<31 | m, idElems: h.idElems, backends: top, digest: t.Digest,
		checksum: TableChecksum(t.Slots), layout: tableLayout}
	if err := inner.Update(uint32(0), head.elem(), ebpf.UpdateExist); err != nil {
		return 0, fmt.Errorf("change maglev table: flip: %w", err)
	}
	written := len(keys) + 1
	d.writes.Add(uint64(written))
	return written, nil
}

// wantedAt reports whether index i holds a backend of the new table (want maps the
// new table's IDs to their index).
func wantedAt(want map[uint32]int, id uint32, i int) bool {
	w, ok := want[id]
	return ok && w == i
}

// ReadTable returns what a service's table map holds, nil if it has none.
func (d *Datapath) ReadTable(serviceID uint32) (*TableState, error) {
	inner, err := d.tableMap(serviceID)
	if err != nil || inner == nil {
		return nil, err
	}
	defer inner.Close()
	info, err := inner.Info()
	if err != nil {
		return nil, fmt.Errorf("read maglev table: %w", err)
	}
	st := &TableState{}
	st.MapID, _ = info.ID()
	elems, err := readElems(inner)
	if err != nil {
		return nil, fmt.Errorf("read maglev table: %w", err)
	}
	h := parseHead(elems[0])
	m := h.m()
	if h.layout != tableLayout || m == 0 || uint32(len(elems)) != 1+h.idElems+2*((m+slotsPerElem-1)/slotsPerElem) {
		return st, nil
	}
	st.Digest, st.Checksum, st.Backends = h.digest, h.checksum, int(h.idElems*idsPerElem)
	st.Slots = make([]uint32, m)
	start := h.halfStart(h.active())
	ok := true
	for i := range m {
		s := uint32(slotOf(elems, start, i))
		if s >= h.idElems*idsPerElem {
			ok = false
			continue
		}
		st.Slots[i] = elems[1+s/idsPerElem][s%idsPerElem]
	}
	st.Intact = ok && TableChecksum(st.Slots) == h.checksum
	return st, nil
}

// MaglevTable returns the table the datapath uses for a service, nil if none.
func (d *Datapath) MaglevTable(serviceID uint32) ([]uint32, error) {
	st, err := d.ReadTable(serviceID)
	if err != nil || st == nil {
		return nil, err
	}
	if st.Slots == nil {
		return nil, fmt.Errorf("read maglev table of service %d: not a table of this version", serviceID)
	}
	return st.Slots, nil
}

// DeleteMaglevTable removes a service's table: new flows then get no backend.
func (d *Datapath) DeleteMaglevTable(serviceID uint32) error {
	err := d.objs.LbMaglev.Delete(serviceID)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete maglev table: %w", err)
	}
	d.writes.Add(1)
	return nil
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

// readElems reads every element of a table map.
func readElems(inner *ebpf.Map) ([]tableElem, error) {
	if inner.ValueSize() != TableElemBytes {
		return nil, fmt.Errorf("table map of %d-byte values: %w", inner.ValueSize(), ErrTableShape)
	}
	return readArray[tableElem](inner)
}
