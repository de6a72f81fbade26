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
// entries, in batches, without decoding them: the garbage collector reads the whole
// table on every pass.
func (d *Datapath) SweepConntrack(now time.Duration) (scanned, deleted int, err error) {
	keys := make([]lbxdpLbCtKey, conntrackBatch)
	vals := make([]lbxdpLbCt, conntrackBatch)
	var expired []lbxdpLbCtKey
	var cursor ebpf.MapBatchCursor
	for {
		n, lerr := d.objs.LbConntrack.BatchLookup(&cursor, keys, vals, nil)
		scanned += n
		for i := range n {
			if uint64(now) > vals[i].ExpiresNs {
				expired = append(expired, keys[i])
			}
		}
		if errors.Is(lerr, ebpf.ErrKeyNotExist) {
			break
		}
		if lerr != nil {
			return scanned, 0, fmt.Errorf("sweep conntrack: %w", lerr)
		}
	}
	deleted, err = d.deleteCTKeys(expired)
	return scanned, deleted, err
}
