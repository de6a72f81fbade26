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
			n, err := d.deleteCTKeys(keys)
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
