//go:build linux

package lbxdp

import (
	"errors"
	"fmt"
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
// the next change, by then long unread; a new map's second half holds zeros until its
// first change. Only a new service, a new size or more backends
// than the map has indexes for replace the map itself, which costs an RCU grace period
// in the kernel.
const (
	tableHalfBit = 1 << 31
	// TableElemBytes is the size of a table map's elements. It and the two below are
	// untyped, for int and uint32 arithmetic alike: TestConstantsAsCompiled compares
	// them with the program (LB_TABLE_SLOTS, LB_TABLE_IDS, lb_tables' value size).
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
	// Backends are the backend IDs the slots refer to.
	Backends []uint32
	// Slots holds, for each slot, an index into Backends; its length is the table
	// size M.
	Slots []uint16
	// Digest identifies what the table was built from. The datapath keeps it in the
	// map, so that a restarted daemon can tell whether the table it finds is the one
	// it would build, without building it.
	Digest uint64
	// Indexes is how many backend indexes a new map gets: at least len(Backends)
	// (fewer are raised to that). A later table with more distinct backends than the
	// map has indexes needs a new map.
	Indexes int
}

// TableOf makes a Table of one backend ID per slot.
func TableOf(ids []uint32) Table {
	var t Table
	index := map[uint32]uint16{}
	t.Slots = make([]uint16, len(ids))
	for i, id := range ids {
		x, ok := index[id]
		if !ok {
			x = uint16(len(t.Backends))
			index[id] = x
			t.Backends = append(t.Backends, id)
		}
		t.Slots[i] = x
	}
	return t
}

// IDs returns the backend ID of each slot (0 for an index out of range).
func (t Table) IDs() []uint32 {
	out := make([]uint32, len(t.Slots))
	for i, x := range t.Slots {
		if int(x) < len(t.Backends) {
			out[i] = t.Backends[x]
		}
	}
	return out
}

// Shares counts the slots of each backend ID.
func (t Table) Shares() map[uint32]uint32 {
	counts := make([]uint32, len(t.Backends))
	for _, x := range t.Slots {
		if int(x) < len(counts) {
			counts[x]++
		}
	}
	out := make(map[uint32]uint32, len(counts))
	for i, c := range counts {
		if c > 0 {
			out[t.Backends[i]] += c
		}
	}
	return out
}

// Checksum is the checksum of the backend IDs of the slots, which the map's head
// records: equal for equal slots whatever the indexes. It is FNV-1a taking a 32-bit
// ID per step rather than a byte: it guards against slots changed behind the
// daemon's back, not against an adversary.
func (t Table) Checksum() uint64 {
	const prime = 1099511628211
	h := uint64(14695981039346656037)
	for _, x := range t.Slots {
		var id uint32
		if int(x) < len(t.Backends) {
			id = t.Backends[x]
		}
		h = (h ^ uint64(id)) * prime
	}
	return h
}

// TableState is what a service's table map holds.
type TableState struct {
	// Table is the active half; its Backends are all the map's backend indexes.
	Table
	// Checksum is what the writer recorded (Table.Digest the digest).
	Checksum uint64
	// Intact reports that the active half matches Checksum and every slot refers to
	// a backend index that holds one.
	Intact bool
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

// fits reports whether a map of n elements has this head's layout and shape.
func (h tableHead) fits(n uint32) bool {
	m := h.m()
	return h.layout == tableLayout && m != 0 && n == 1+h.idElems+2*((m+slotsPerElem-1)/slotsPerElem)
}

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
	if m == 0 || m > MaxTableSize || len(t.Backends) == 0 || len(t.Backends) > 1<<16 {
		return nil, fmt.Errorf("new maglev table: %d slots of %d backends: %w", m, len(t.Backends), ErrRange)
	}
	for _, x := range t.Slots {
		if int(x) >= len(t.Backends) {
			return nil, fmt.Errorf("new maglev table: index %d of %d backends: %w", x, len(t.Backends), ErrRange)
		}
	}
	idElems, halfElems := tableShape(m, max(t.Indexes, len(t.Backends)))
	n := 1 + idElems + 2*halfElems
	// Only the head, the backend IDs and the active half are written: the second half
	// stays as the kernel created it (zeros) until the first change, which writes
	// what differs from what it finds there (ChangeTable).
	elems := make([]tableElem, n-halfElems)
	h := tableHead{size: m, idElems: idElems, backends: uint32(len(t.Backends)), digest: t.Digest,
		checksum: t.Checksum(), layout: tableLayout}
	elems[0] = h.elem()
	for i, id := range t.Backends {
		elems[1+i/idsPerElem][i%idsPerElem] = id
	}
	half0 := h.halfStart(0)
	for i := 0; i < len(t.Slots); i += 2 {
		w := uint32(t.Slots[i])
		if i+1 < len(t.Slots) {
			w |= uint32(t.Slots[i+1]) << 16
		}
		elems[half0+uint32(i)/slotsPerElem][(i%slotsPerElem)/2] = w
	}
	spec := d.maglevInner.Copy()
	spec.MaxEntries = n
	inner, err := ebpf.NewMap(spec)
	if err != nil {
		return nil, fmt.Errorf("new maglev table: create map: %w", err)
	}
	keys := make([]uint32, len(elems))
	for i := range keys {
		keys[i] = uint32(i)
	}
	if _, err := inner.BatchUpdate(keys, elems, nil); err != nil {
		inner.Close()
		return nil, fmt.Errorf("new maglev table: fill map: %w", err)
	}
	d.writes.Add(uint64(len(elems)))
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
	if _, err := d.objs.LbTables.BatchUpdate(ids, fds, nil); err != nil {
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
		p, err := d.NewTable(id, TableOf(tables[id]))
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

// DeleteMaglevTable removes a service's table: new flows then get no backend.
func (d *Datapath) DeleteMaglevTable(serviceID uint32) error {
	err := d.objs.LbTables.Delete(serviceID)
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
	if err := d.objs.LbTables.Lookup(serviceID, &id); err != nil {
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
	return readArray[tableElem](inner, inner.MaxEntries())
}

// readActive reads a table map's elements up to the end of its active half (all of
// them when the second half is active): what ReadTable needs, half the elements of a
// table that never changed. A map of another layout is read whole.
func readActive(inner *ebpf.Map) ([]tableElem, error) {
	if inner.ValueSize() != TableElemBytes {
		return nil, fmt.Errorf("table map of %d-byte values: %w", inner.ValueSize(), ErrTableShape)
	}
	var e tableElem
	if err := inner.Lookup(uint32(0), &e); err != nil {
		return nil, err
	}
	n := inner.MaxEntries()
	if h := parseHead(e); h.fits(n) && h.active() == 0 {
		n = h.halfStart(1)
	}
	elems, err := readArray[tableElem](inner, n)
	if err != nil {
		return nil, err
	}
	// The head read with the elements is the one that counts: a flip in between
	// (another writer) may have made the second half active.
	if h := parseHead(elems[0]); h.fits(inner.MaxEntries()) && h.halfStart(h.active()+1) > n {
		return readArray[tableElem](inner, inner.MaxEntries())
	}
	return elems, nil
}
