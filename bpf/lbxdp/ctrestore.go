//go:build linux

package lbxdp

import (
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
)

// RestoreConntrack writes entries into the conntrack tables in batches, replacing
// entries of the same flows, and returns how many it wrote. It restores a dump taken
// with Conntrack (for instance onto another node or after a table was recreated);
// tests use it to load tables of known content. An entry keeps its LastSeen (to the
// second), state and tentative flag; its expiry follows from the config's timeouts.
func (d *Datapath) RestoreConntrack(entries []CTEntry) (int, error) {
	return d.writeConntrack(entries, ebpf.UpdateAny)
}

// AddConntrack writes those of entries whose flow has no entry yet and returns how
// many it wrote: an entry the datapath wrote meanwhile is newer and stays.
func (d *Datapath) AddConntrack(entries []CTEntry) (int, error) {
	return d.writeConntrack(entries, ebpf.UpdateNoExist)
}

func (d *Datapath) writeConntrack(entries []CTEntry, flags ebpf.MapUpdateFlags) (int, error) {
	var (
		ks     ctKeys
		v4, v6 []lbxdpLbCt
	)
	for _, e := range entries {
		if err := ks.add(e.Flow); err != nil {
			return 0, fmt.Errorf("restore conntrack: %w", err)
		}
		if len(ks.v4)+len(ks.v6) > len(v4)+len(v6) {
			if len(ks.v4) > len(v4) {
				v4 = append(v4, rawEntry(e))
			} else {
				v6 = append(v6, rawEntry(e))
			}
		}
	}
	n4, err := writeCT(d.objs.LbCt4, ks.v4, v4, flags)
	if err != nil {
		return n4, err
	}
	n6, err := writeCT(d.objs.LbCt6, ks.v6, v6, flags)
	return n4 + n6, err
}

// writeCT writes keys and vals: in batches when replacing, one by one when
// adding (the kernel's batch update does not take BPF_NOEXIST), skipping keys
// that exist.
func writeCT[K ctKey](m *ebpf.Map, keys []K, vals []lbxdpLbCt, flags ebpf.MapUpdateFlags) (int, error) {
	if flags == ebpf.UpdateNoExist {
		written := 0
		for i := range keys {
			err := m.Update(&keys[i], &vals[i], flags)
			if errors.Is(err, ebpf.ErrKeyExist) {
				continue
			}
			if err != nil {
				return written, fmt.Errorf("add conntrack: %w", err)
			}
			written++
		}
		return written, nil
	}
	written := 0
	for len(keys) > 0 {
		n := min(len(keys), conntrackBatch)
		w, err := m.BatchUpdate(keys[:n], vals[:n], &ebpf.BatchOptions{})
		written += w
		if err != nil {
			return written, fmt.Errorf("restore conntrack: %w", err)
		}
		keys, vals = keys[n:], vals[n:]
	}
	return written, nil
}

// rawEntry is the map value of an entry. The flow hash is left 0: the datapath
// computes it per packet until the entry's next refresh stores it.
func rawEntry(e CTEntry) lbxdpLbCt {
	v := lbxdpLbCt{
		BackendId: e.BackendID, ServiceId: e.ServiceID, State: uint8(e.State),
		LastSeen: uint32(e.LastSeen / time.Second),
	}
	if e.Tentative {
		v.Flags = ctTentative
	}
	return v
}
