package store

import "slices"

// idAlloc hands out the smallest free identifier, so datapath IDs stay dense (they index
// BPF maps) and are reused only after their owner is gone.
type idAlloc struct {
	next uint32   // smallest ID never handed out
	free []uint32 // released IDs below next, ascending
}

// newIDAlloc rebuilds an allocator from the IDs in use (restored state).
func newIDAlloc(used []uint32) idAlloc {
	slices.Sort(used)
	a := idAlloc{next: 1}
	for _, id := range used {
		for ; a.next < id; a.next++ {
			a.free = append(a.free, a.next)
		}
		a.next = id + 1
	}
	return a
}

// idTxn allocates and releases IDs tentatively; commit makes it final. IDs released in a
// transaction are not handed out again within it.
type idTxn struct {
	a        *idAlloc
	taken    int
	next     uint32
	released []uint32
}

func (a *idAlloc) begin() idTxn { return idTxn{a: a, next: a.next} }

func (t *idTxn) get() uint32 {
	if t.taken < len(t.a.free) {
		id := t.a.free[t.taken]
		t.taken++
		return id
	}
	id := t.next
	t.next++
	return id
}

func (t *idTxn) put(id uint32) { t.released = append(t.released, id) }

func (t *idTxn) commit() {
	free := append(slices.Clone(t.a.free[t.taken:]), t.released...)
	slices.Sort(free)
	t.a.free, t.a.next = free, t.next
}
