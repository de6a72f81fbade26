//go:build linux

package lbxdp

import (
	"fmt"

	"github.com/cilium/ebpf"
)

// RestoreConntrack writes entries into the conntrack table in batches, replacing
// entries of the same flows, and returns how many it wrote. It restores a dump taken
// with Conntrack (for instance onto another node or after a table was recreated);
// tests use it to load tables of known content.
func (d *Datapath) RestoreConntrack(entries []CTEntry) (int, error) {
	keys := make([]lbxdpLbCtKey, 0, conntrackBatch)
	vals := make([]lbxdpLbCt, 0, conntrackBatch)
	written := 0
	flush := func() error {
		if len(keys) == 0 {
			return nil
		}
		n, err := d.objs.LbConntrack.BatchUpdate(keys, vals, &ebpf.BatchOptions{})
		written += n
		keys, vals = keys[:0], vals[:0]
		if err != nil {
			return fmt.Errorf("restore conntrack: %w", err)
		}
		return nil
	}
	for _, e := range entries {
		k, err := e.Flow.raw()
		if err != nil {
			return written, fmt.Errorf("restore conntrack: %w", err)
		}
		keys = append(keys, k)
		vals = append(vals, lbxdpLbCt{
			CreatedNs: uint64(e.Created), LastSeenNs: uint64(e.LastSeen), ExpiresNs: uint64(e.ExpiresAt),
			BackendId: e.BackendID, ServiceId: e.ServiceID, State: uint8(e.State),
		})
		if len(keys) == conntrackBatch {
			if err := flush(); err != nil {
				return written, err
			}
		}
	}
	return written, flush()
}
