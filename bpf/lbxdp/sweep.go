//go:build linux

package lbxdp

import (
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
)

// SweepConntrack deletes every conntrack entry that expired before now (MonotonicNow
// clock) and returns how many entries it read and deleted. It works on the raw map
// entries without decoding them, and deletes each batch's expired entries on a second
// goroutine while the next batch is read: the garbage collector reads the whole table on
// every pass, and reading and deleting cost about the same in the kernel.
//
// Between the read and the delete a packet of the flow may have come: the program
// treats an expired entry as none and writes a fresh one under the same key. Each
// entry is therefore read again just before it is deleted, and kept if it no longer
// expired (deleteExpired).
func (d *Datapath) SweepConntrack(now time.Duration) (scanned, deleted int, err error) {
	type result struct {
		n   int
		err error
	}
	chunks := make(chan []lbxdpLbCtKey, 4)
	done := make(chan result, 1)
	go func() {
		var r result
		for keys := range chunks {
			if r.err != nil {
				continue // drain after a failure
			}
			n, err := d.deleteExpired(keys, now)
			r.n += n
			r.err = err
		}
		done <- r
	}()
	keys := make([]lbxdpLbCtKey, conntrackBatch)
	vals := make([]lbxdpLbCt, conntrackBatch)
	var cursor ebpf.MapBatchCursor
	var lookupErr error
	for {
		n, lerr := d.objs.LbConntrack.BatchLookup(&cursor, keys, vals, nil)
		scanned += n
		var expired []lbxdpLbCtKey
		for i := range n {
			if uint64(now) > vals[i].ExpiresNs {
				expired = append(expired, keys[i])
			}
		}
		if len(expired) > 0 {
			chunks <- expired
		}
		if errors.Is(lerr, ebpf.ErrKeyNotExist) {
			break
		}
		if lerr != nil {
			lookupErr = fmt.Errorf("sweep conntrack: %w", lerr)
			break
		}
	}
	close(chunks)
	r := <-done
	return scanned, r.n, errors.Join(lookupErr, r.err)
}

// deleteExpired deletes those of keys whose entry is still expired at now: an entry
// that traffic wrote again since it was read is kept. (A packet can still come between
// this read and the delete; the window is a syscall, not a whole batch.)
func (d *Datapath) deleteExpired(keys []lbxdpLbCtKey, now time.Duration) (int, error) {
	stale := keys[:0]
	var v lbxdpLbCt
	for i := range keys {
		err := d.objs.LbConntrack.Lookup(&keys[i], &v)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("sweep conntrack: read again: %w", err)
		}
		if uint64(now) > v.ExpiresNs {
			stale = append(stale, keys[i])
		}
	}
	return d.deleteCTKeys(stale)
}
