//go:build linux

package lbxdp

import (
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
)

// SweepConntrack deletes every conntrack entry expired at now (MonotonicNow clock),
// then, if more than the configured capacity (Options.ConntrackSize) are left,
// reclaims the excess from the entries that hold no established flow: unconfirmed
// ones (tentative, TCP SYN only, an SCTP handshake) and closing ones (FIN or RST
// seen, an SCTP shutdown or abort), the longest
// idle first. It returns how many entries it read and deleted, expired and
// reclaimed, and how full the maps are left; ConntrackEvents counts the reclaimed
// too (CTReclaimed).
//
// The maps hold a quarter more than the capacity, so that new flows meet free
// entries while the collector has not yet passed; the reclaim gives that headroom
// back. An established flow is never cut short: the datapath cannot tell a real
// connection from a spoofed one that sent a SYN and an ACK, so a flood of those
// is stopped by the flood guard (Config.GuardRate) instead, and what still fills
// the table fails to insert (CTInsertFailed) and is balanced by the Maglev table
// alone, rather than pushing out flows that were there first.
//
// Expired entries are found in one pass over the raw map entries, deleted on a
// second goroutine while the next batch is read (reading and deleting cost about
// the same in the kernel); the same pass counts the reclaimable entries by idle
// time, from which a second pass, needed only under pressure, knows which ones to
// reclaim.
//
// Between the read and the delete a packet of the flow may have come and written
// the entry again: each entry is read again just before it is deleted, and kept if
// it no longer matches (deleteMatching).
func (d *Datapath) SweepConntrack(now time.Duration) (CTSweep, error) {
	t, err := d.timeouts()
	if err != nil {
		return CTSweep{}, fmt.Errorf("sweep conntrack: %w", err)
	}
	nowSec := uint32(now / time.Second)
	hist := new(idleHistogram)
	expired := func(v *lbxdpLbCt) bool { return t.expired(v, now) }
	observe := func(v *lbxdpLbCt) {
		if !expired(v) {
			hist.add(v, nowSec)
		}
	}
	var maps ctPasses
	err = d.sweepBoth(&maps, expired, observe)
	r := maps.result(d)
	if err != nil {
		return r, fmt.Errorf("sweep conntrack: %w", err)
	}
	excess := r.Scanned - r.Deleted - int(d.opts.ConntrackSize)
	if excess <= 0 || hist.empty() {
		return r, nil
	}
	cut := hist.cutoff(excess)
	before := r.Deleted
	var again ctPasses
	err = d.sweepBoth(&again, func(v *lbxdpLbCt) bool { return expired(v) || cut.reclaims(v, nowSec) }, nil)
	for i := range maps {
		maps[i].deleted += again[i].deleted
	}
	r = maps.result(d)
	r.Reclaimed = r.Deleted - before
	d.ctReclaimed.Add(uint64(r.Reclaimed))
	if err != nil {
		return r, fmt.Errorf("sweep conntrack: reclaim: %w", err)
	}
	return r, nil
}

// CTSweep is what SweepConntrack did.
type CTSweep struct {
	// Scanned entries were read; Deleted of them deleted, Reclaimed of those before
	// they expired.
	Scanned, Deleted, Reclaimed int
	// Fill is the fuller map's live entries over its size.
	Fill float64
}

// ctPasses counts a pass over each conntrack map: IPv4, IPv6.
type ctPasses [2]struct{ scanned, deleted int }

func (p *ctPasses) result(d *Datapath) CTSweep {
	var r CTSweep
	for i, m := range []*ebpf.Map{d.objs.LbCt4, d.objs.LbCt6} {
		r.Scanned += p[i].scanned
		r.Deleted += p[i].deleted
		r.Fill = max(r.Fill, float64(p[i].scanned-p[i].deleted)/float64(m.MaxEntries()))
	}
	return r
}

// sweepBoth runs sweepPass over both conntrack maps.
func (d *Datapath) sweepBoth(p *ctPasses, match func(*lbxdpLbCt) bool, observe func(*lbxdpLbCt)) error {
	var err error
	p[0].scanned, p[0].deleted, err = sweepPass[lbxdpLbCt4Key](d.objs.LbCt4, match, observe)
	if err != nil {
		return err
	}
	p[1].scanned, p[1].deleted, err = sweepPass[lbxdpLbCtKey](d.objs.LbCt6, match, observe)
	return err
}

// sweepPass reads a whole conntrack map, calls observe (if set) for every entry
// and deletes those that match, read again just before the delete.
func sweepPass[K ctKey](m *ebpf.Map, match func(*lbxdpLbCt) bool, observe func(*lbxdpLbCt)) (scanned, deleted int, err error) {
	type result struct {
		n   int
		err error
	}
	chunks := make(chan []K, 4)
	done := make(chan result, 1)
	go func() {
		var r result
		for keys := range chunks {
			if r.err != nil {
				continue // drain after a failure
			}
			n, err := deleteMatching(m, keys, match)
			r.n += n
			r.err = err
		}
		done <- r
	}()
	keys := make([]K, conntrackBatch)
	vals := make([]lbxdpLbCt, conntrackBatch)
	var cursor ebpf.MapBatchCursor
	var lookupErr error
	for {
		n, lerr := m.BatchLookup(&cursor, keys, vals, nil)
		scanned += n
		var doomed []K
		for i := range n {
			if observe != nil {
				observe(&vals[i])
			}
			if match(&vals[i]) {
				doomed = append(doomed, keys[i])
			}
		}
		if len(doomed) > 0 {
			chunks <- doomed
		}
		if errors.Is(lerr, ebpf.ErrKeyNotExist) {
			break
		}
		if lerr != nil {
			lookupErr = lerr
			break
		}
	}
	close(chunks)
	r := <-done
	return scanned, r.n, errors.Join(lookupErr, r.err)
}

// deleteMatching deletes those of keys whose entry still matches: an entry that
// traffic wrote again since it was read is judged again. (A packet can still come
// between this read and the delete; the window is a syscall, not a whole batch.)
func deleteMatching[K ctKey](m *ebpf.Map, keys []K, match func(*lbxdpLbCt) bool) (int, error) {
	stale := keys[:0]
	var v lbxdpLbCt
	for i := range keys {
		err := m.Lookup(&keys[i], &v)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("read again: %w", err)
		}
		if match(&v) {
			stale = append(stale, keys[i])
		}
	}
	return deleteCTKeys(m, stale)
}

// idleBuckets bounds the idle times the reclaim tells apart, in seconds; longer
// idle times share the last bucket.
const idleBuckets = 1 << 16

// idleHistogram counts reclaimable live entries by whole seconds idle.
type idleHistogram [idleBuckets]int32

// reclaimable reports whether an entry holds no established flow: tentative, SYN
// only (an SCTP handshake), or closing (an SCTP association shutting down or gone).
func reclaimable(v *lbxdpLbCt) bool {
	if v.Flags&ctTentative != 0 {
		return true
	}
	switch CTState(v.State) {
	case CTSyn, CTClosing, CTSCTPInit, CTSCTPCookie, CTSCTPShutdown, CTSCTPClosed:
		return true
	}
	return false
}

func idleOf(v *lbxdpLbCt, nowSec uint32) int {
	idle := int32(nowSec - v.LastSeen)
	return int(min(max(idle, 0), idleBuckets-1))
}

func (h *idleHistogram) empty() bool { return *h == idleHistogram{} }

func (h *idleHistogram) add(v *lbxdpLbCt, nowSec uint32) {
	if reclaimable(v) {
		h[idleOf(v, nowSec)]++
	}
}

// reclaimCut selects the reclaimable entries idle at least that many seconds
// (idleBuckets: none).
type reclaimCut int

func (c reclaimCut) reclaims(v *lbxdpLbCt, nowSec uint32) bool {
	return reclaimable(v) && idleOf(v, nowSec) >= int(c)
}

// cutoff returns the smallest cut, the longest idle first, that reclaims at least n
// entries, or all reclaimable ones. It may take more than n: the entries of the
// last bucket it reaches go together.
func (h *idleHistogram) cutoff(n int) reclaimCut {
	for idle := idleBuckets - 1; idle >= 0; idle-- {
		n -= int(h[idle])
		if n <= 0 {
			return reclaimCut(idle)
		}
	}
	return 0
}
