package store

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
)

// idAlloc hands out the smallest free identifier, so datapath IDs stay dense (they index
// BPF maps) and are reused only after their owner is gone, and, when hold is set, only
// after the datapath applied the owner's removal (Store.Reconciled).
type idAlloc struct {
	next uint32   // smallest ID never handed out
	free []uint32 // released IDs below next, ascending
	hold bool
	held []heldID // released IDs waiting for the datapath
	// max is the highest ID the datapath's maps hold (the limit); 0: no bound.
	max uint32
}

// heldID is an ID released by the change with Seq seq.
type heldID struct {
	id  uint32
	seq uint64
}

// newIDAlloc rebuilds an allocator from the IDs in use (restored state). With hold, the
// gaps are held until the first Reconciled: a datapath left by an earlier daemon may
// still hold entries under them.
func newIDAlloc(used []uint32, hold bool, max uint32) idAlloc {
	slices.Sort(used)
	a := idAlloc{next: 1, hold: hold, max: max}
	var gaps []uint32
	for _, id := range used {
		for ; a.next < id; a.next++ {
			gaps = append(gaps, a.next)
		}
		a.next = id + 1
	}
	if hold {
		for _, id := range gaps {
			a.held = append(a.held, heldID{id: id})
		}
	} else {
		a.free = gaps
	}
	return a
}

// isHeld reports whether id waits for the datapath (Options.HoldIDs).
func (a *idAlloc) isHeld(id uint32) bool {
	for _, h := range a.held {
		if h.id == id {
			return true
		}
	}
	return false
}

// release frees the held IDs released by changes up to seq.
func (a *idAlloc) release(seq uint64) {
	var freed []uint32
	n := 0
	for _, h := range a.held {
		if h.seq <= seq {
			freed = append(freed, h.id)
		} else {
			a.held[n] = h
			n++
		}
	}
	if len(freed) > 0 {
		a.held = a.held[:n]
		slices.Sort(freed)
		a.free = mergeIDs(a.free, freed)
	}
}

// mergeIDs merges two ascending lists into a new one.
func mergeIDs(a, b []uint32) []uint32 {
	out := make([]uint32, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		if a[0] < b[0] {
			out, a = append(out, a[0]), a[1:]
		} else {
			out, b = append(out, b[0]), b[1:]
		}
	}
	return append(append(out, a...), b...)
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

// over reports whether the transaction handed out an ID above the allocator's max.
func (t *idTxn) over() bool { return t.a.max > 0 && t.next > t.a.next && t.next-1 > t.a.max }

// check refuses a transaction that handed out an ID above max, what of the kind names.
// When IDs released by earlier changes still wait for the datapath the refusal is
// retryable (errIDsHeld): once they are free the change fits.
func (t *idTxn) check(what, limit string) error {
	if !t.over() {
		return nil
	}
	if n := len(t.a.held); n > 0 {
		return &Error{Code: codes.Unavailable, Field: limit, Msg: fmt.Sprintf(
			"every %s ID up to the limit of %d is taken: %d of them belonged to %ss deleted by changes the datapath has not applied yet; try again in a moment",
			what, t.a.max, n, what), retry: true}
	}
	return failedPrecondition(limit, "the change needs %s IDs above the limit of %d: IDs it frees are handed out again only after the datapath applied it; make the change in two steps (remove, then add)", what, t.a.max)
}

// commit makes the transaction final; its released IDs are free at once, or held until
// the change with Seq seq is reconciled.
func (t *idTxn) commit(seq uint64) {
	t.a.free, t.a.next = t.a.free[t.taken:], t.next
	if t.a.hold {
		for _, id := range t.released {
			t.a.held = append(t.a.held, heldID{id: id, seq: seq})
		}
	} else if len(t.released) > 0 {
		slices.Sort(t.released)
		t.a.free = mergeIDs(t.a.free, t.released)
	}
}

// heldIDWait bounds how long a change waits for IDs that the datapath still holds.
var heldIDWait = 5 * time.Second

// retryHeld runs try until it is not refused for IDs held for the datapath, waiting
// for the datapath to apply changes (Store.Reconciled) between tries, at most
// heldIDWait in all; then the refusal is the answer.
func retryHeld[T any](s *Store, try func() (T, error)) (T, error) {
	deadline := time.Now().Add(heldIDWait)
	for {
		s.mu.RLock()
		reconciled := s.reconciled
		s.mu.RUnlock()
		v, err := try()
		var e *Error
		wait := time.Until(deadline)
		if !errors.As(err, &e) || !e.retry || wait <= 0 {
			return v, err
		}
		timer := time.NewTimer(wait)
		select {
		case <-reconciled:
		case <-timer.C:
		}
		timer.Stop()
	}
}
