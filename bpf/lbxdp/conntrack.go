//go:build linux

package lbxdp

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
)

// Flow is a client-to-VIP 5-tuple as the client sent it.
type Flow struct {
	Src   netip.AddrPort // client
	Dst   netip.AddrPort // VIP
	Proto uint8
}

// CTState is the TCP-derived state of a conntrack entry; it selects the
// entry's timeout.
type CTState uint8

// Conntrack states, mirroring enum lb_ct_state.
const (
	CTOther       CTState = 0 // UDP
	CTSyn         CTState = 1 // SYN seen, no ACK yet
	CTEstablished CTState = 2
	CTClosing     CTState = 3 // FIN or RST seen
)

func (s CTState) String() string {
	switch s {
	case CTOther:
		return "other"
	case CTSyn:
		return "syn"
	case CTEstablished:
		return "established"
	case CTClosing:
		return "closing"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// CTEntry is one conntrack entry. Times are on the MonotonicNow clock.
type CTEntry struct {
	Flow      Flow
	BackendID uint32
	ServiceID uint32
	State     CTState
	Created   time.Duration
	LastSeen  time.Duration
	ExpiresAt time.Duration
}

// Expired reports whether the entry is past its lifetime at now.
func (e CTEntry) Expired(now time.Duration) bool { return now > e.ExpiresAt }

func (f Flow) raw() (lbxdpLbCtKey, error) {
	s, fam, err := addrBytes(f.Src.Addr())
	if err != nil {
		return lbxdpLbCtKey{}, err
	}
	dst, dfam, err := addrBytes(f.Dst.Addr())
	if err != nil {
		return lbxdpLbCtKey{}, err
	}
	if fam != dfam {
		return lbxdpLbCtKey{}, fmt.Errorf("flow %v -> %v: %w", f.Src, f.Dst, ErrFamily)
	}
	return lbxdpLbCtKey{Saddr: s, Daddr: dst, Sport: htons(f.Src.Port()), Dport: htons(f.Dst.Port()), Proto: f.Proto, Family: fam}, nil
}

func flowFromRaw(k *lbxdpLbCtKey) Flow {
	return Flow{
		Src:   netip.AddrPortFrom(bytesAddr(k.Saddr, k.Family), htons(k.Sport)),
		Dst:   netip.AddrPortFrom(bytesAddr(k.Daddr, k.Family), htons(k.Dport)),
		Proto: k.Proto,
	}
}

func entryFromRaw(k *lbxdpLbCtKey, v *lbxdpLbCt) CTEntry {
	return CTEntry{
		Flow:      flowFromRaw(k),
		BackendID: v.BackendId,
		ServiceID: v.ServiceId,
		State:     CTState(v.State),
		Created:   time.Duration(v.CreatedNs),
		LastSeen:  time.Duration(v.LastSeenNs),
		ExpiresAt: time.Duration(v.ExpiresNs),
	}
}

// conntrackBatch is how many entries one batch syscall moves.
const conntrackBatch = 4096

// Conntrack calls fn for every conntrack entry, reading the map in batches,
// until fn returns false. Entries added or removed meanwhile may or may not be
// seen.
func (d *Datapath) Conntrack(fn func(CTEntry) bool) error {
	keys := make([]lbxdpLbCtKey, conntrackBatch)
	vals := make([]lbxdpLbCt, conntrackBatch)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := d.objs.LbConntrack.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			if !fn(entryFromRaw(&keys[i], &vals[i])) {
				return nil
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("list conntrack: %w", err)
		}
	}
}

// ConntrackLookup returns the entry of one flow; ok is false if there is none.
func (d *Datapath) ConntrackLookup(f Flow) (e CTEntry, ok bool, err error) {
	k, err := f.raw()
	if err != nil {
		return CTEntry{}, false, fmt.Errorf("look up conntrack: %w", err)
	}
	var v lbxdpLbCt
	if err := d.objs.LbConntrack.Lookup(&k, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return CTEntry{}, false, nil
		}
		return CTEntry{}, false, fmt.Errorf("look up conntrack: %w", err)
	}
	return entryFromRaw(&k, &v), true, nil
}

// DeleteConntrack deletes the entries of the given flows in batches and
// returns how many existed.
func (d *Datapath) DeleteConntrack(flows []Flow) (int, error) {
	keys := make([]lbxdpLbCtKey, 0, len(flows))
	for _, f := range flows {
		k, err := f.raw()
		if err != nil {
			return 0, fmt.Errorf("delete conntrack: %w", err)
		}
		keys = append(keys, k)
	}
	return d.deleteCTKeys(keys)
}

// deleteCTKeys deletes keys in batches. A batch stops at the first missing key
// (the LRU may have evicted it meanwhile), so the rest of that batch is
// retried one by one.
func (d *Datapath) deleteCTKeys(keys []lbxdpLbCtKey) (int, error) {
	deleted := 0
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), conntrackBatch)]
		keys = keys[len(chunk):]
		n, err := d.objs.LbConntrack.BatchDelete(chunk, nil)
		deleted += n
		if err == nil {
			continue
		}
		if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return deleted, fmt.Errorf("delete conntrack: %w", err)
		}
		for i := n + 1; i < len(chunk); i++ {
			err := d.objs.LbConntrack.Delete(&chunk[i])
			if err == nil {
				deleted++
			} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
				return deleted, fmt.Errorf("delete conntrack: %w", err)
			}
		}
	}
	return deleted, nil
}

// DeleteConntrackWhere deletes every entry for which match returns true and
// returns how many were deleted. The garbage collector passes an expiry test;
// disabling a backend passes a backend-ID test.
func (d *Datapath) DeleteConntrackWhere(match func(CTEntry) bool) (int, error) {
	var keys []lbxdpLbCtKey
	err := d.Conntrack(func(e CTEntry) bool {
		if match(e) {
			k, err := e.Flow.raw()
			if err == nil {
				keys = append(keys, k)
			}
		}
		return true
	})
	if err != nil {
		return 0, err
	}
	return d.deleteCTKeys(keys)
}

// DeleteConntrackByBackend deletes the entries of flows pinned to any of ids.
func (d *Datapath) DeleteConntrackByBackend(ids ...uint32) (int, error) {
	set := make(map[uint32]bool, len(ids))
	for _, id := range ids {
		set[id] = true
	}
	return d.DeleteConntrackWhere(func(e CTEntry) bool { return set[e.BackendID] })
}

// AffinityEntry records which backend a client's last new flow got.
type AffinityEntry struct {
	ServiceID uint32
	Client    netip.Addr
	BackendID uint32
	LastSeen  time.Duration // MonotonicNow clock
}

// Affinity lists the affinity entries.
func (d *Datapath) Affinity() ([]AffinityEntry, error) {
	var out []AffinityEntry
	var k lbxdpLbAffKey
	var v lbxdpLbAff
	it := d.objs.LbAffinity.Iterate()
	for it.Next(&k, &v) {
		out = append(out, AffinityEntry{ServiceID: k.ServiceId, Client: bytesAddr(k.Addr, k.Family), BackendID: v.BackendId, LastSeen: time.Duration(v.LastSeenNs)})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list affinity: %w", err)
	}
	return out, nil
}

func affKey(serviceID uint32, client netip.Addr) (lbxdpLbAffKey, error) {
	a, fam, err := addrBytes(client)
	if err != nil {
		return lbxdpLbAffKey{}, err
	}
	return lbxdpLbAffKey{ServiceId: serviceID, Family: fam, Addr: a}, nil
}

// SetAffinity writes an affinity entry (for restoring state or tests).
func (d *Datapath) SetAffinity(e AffinityEntry) error {
	k, err := affKey(e.ServiceID, e.Client)
	if err != nil {
		return fmt.Errorf("set affinity: %w", err)
	}
	v := lbxdpLbAff{LastSeenNs: uint64(e.LastSeen), BackendId: e.BackendID}
	if err := d.objs.LbAffinity.Update(&k, &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("set affinity: %w", err)
	}
	return nil
}

// DeleteAffinity removes a client's affinity entry for a service.
func (d *Datapath) DeleteAffinity(serviceID uint32, client netip.Addr) error {
	k, err := affKey(serviceID, client)
	if err != nil {
		return fmt.Errorf("delete affinity: %w", err)
	}
	if err := d.objs.LbAffinity.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete affinity: %w", err)
	}
	return nil
}
