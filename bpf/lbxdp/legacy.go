//go:build linux

package lbxdp

import (
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
)

// LegacyConntrackName is the pinned name of the conntrack map lbd used before
// conntrack was split by family: an LRU hash of lb_ct_key (40 bytes) to a 40-byte
// value. A node that ran that lbd still has it pinned, and its programs write it
// until the new ones replace them; AdoptLegacyConntrack carries its flows over.
const LegacyConntrackName = "lb_conntrack"

// LegacyTablesName is the pinned name of the outer Maglev map lbd used before tables
// held 2-byte indexes (lb_tables now): its inner maps have 8-byte slots, a layout the
// current programs cannot read. Nothing is carried over (Sync rebuilds the tables);
// its pin is removed once the old programs are replaced, which frees its tables.
const LegacyTablesName = "lb_maglev"

// legacyCT is that map's value.
type legacyCT struct {
	CreatedNs  uint64
	LastSeenNs uint64
	ExpiresNs  uint64
	BackendID  uint32
	ServiceID  uint32
	State      uint8
	_          [3]uint8
	Hash       uint32
}

// IsLegacyConntrack reports whether m has the legacy conntrack layout.
func IsLegacyConntrack(m *ebpf.Map) bool {
	return m.Type() == ebpf.LRUHash && m.KeySize() == 40 && m.ValueSize() == 40
}

// AdoptLegacyConntrack copies the flows of a legacy conntrack map (see
// LegacyConntrackName) that have not expired at now into the conntrack maps, with
// their backend, service, state and last-seen time, and returns how many it wrote
// and how many were there already. With replace, an existing entry is overwritten
// (the first copy, before the new programs run); without, it stays (the copy after
// the switch: what the new programs wrote is newer).
func (d *Datapath) AdoptLegacyConntrack(old *ebpf.Map, now time.Duration, replace bool) (written, present int, err error) {
	if !IsLegacyConntrack(old) {
		return 0, 0, fmt.Errorf("adopt legacy conntrack: map %v (key %d, value %d bytes) is not one", old.Type(), old.KeySize(), old.ValueSize())
	}
	keys := make([]lbxdpLbCtKey, conntrackBatch)
	vals := make([]legacyCT, conntrackBatch)
	var cursor ebpf.MapBatchCursor
	for {
		n, lerr := old.BatchLookup(&cursor, keys, vals, nil)
		entries := make([]CTEntry, 0, n)
		for i := range n {
			v := &vals[i]
			if uint64(now) > v.ExpiresNs {
				continue
			}
			entries = append(entries, CTEntry{
				Flow: keys[i].flow(), BackendID: v.BackendID, ServiceID: v.ServiceID,
				State: CTState(v.State), LastSeen: time.Duration(v.LastSeenNs),
			})
		}
		var w int
		var err error
		if replace {
			w, err = d.RestoreConntrack(entries)
		} else {
			w, err = d.AddConntrack(entries)
		}
		written += w
		present += len(entries) - w
		if err != nil {
			return written, present, fmt.Errorf("adopt legacy conntrack: %w", err)
		}
		if errors.Is(lerr, ebpf.ErrKeyNotExist) {
			return written, present, nil
		}
		if lerr != nil {
			return written, present, fmt.Errorf("adopt legacy conntrack: %w", lerr)
		}
	}
}
