//go:build linux

package lbxdp

import (
	"encoding/binary"
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

// CTState is the state of a conntrack entry, from TCP flags or SCTP chunk types;
// it selects the entry's timeout.
type CTState uint8

// Conntrack states: enum lb_ct_state, as bpf2go generates it.
const (
	CTOther       = CTState(lbxdpLbCtStateLB_CT_OTHER) // UDP
	CTSyn         = CTState(lbxdpLbCtStateLB_CT_SYN)   // SYN seen, no ACK yet
	CTEstablished = CTState(lbxdpLbCtStateLB_CT_ESTABLISHED)
	CTClosing     = CTState(lbxdpLbCtStateLB_CT_CLOSING) // FIN or RST seen
	// SCTP associations, from the client's chunks (the LB node sees no other).
	CTSCTPInit        = CTState(lbxdpLbCtStateLB_CT_SCTP_INIT)   // INIT seen
	CTSCTPCookie      = CTState(lbxdpLbCtStateLB_CT_SCTP_COOKIE) // COOKIE ECHO seen
	CTSCTPEstablished = CTState(lbxdpLbCtStateLB_CT_SCTP_ESTABLISHED)
	CTSCTPShutdown    = CTState(lbxdpLbCtStateLB_CT_SCTP_SHUTDOWN) // SHUTDOWN or SHUTDOWN ACK seen
	CTSCTPClosed      = CTState(lbxdpLbCtStateLB_CT_SCTP_CLOSED)   // ABORT or SHUTDOWN COMPLETE seen
)

// ctStateNames names every state; a state of the C enum without a name here fails
// the package's tests.
var ctStateNames = map[CTState]string{
	CTOther:           "other",
	CTSyn:             "syn",
	CTEstablished:     "established",
	CTClosing:         "closing",
	CTSCTPInit:        "sctp-init",
	CTSCTPCookie:      "sctp-cookie-echoed",
	CTSCTPEstablished: "sctp-established",
	CTSCTPShutdown:    "sctp-shutdown",
	CTSCTPClosed:      "sctp-closed",
}

func (s CTState) String() string {
	if n, ok := ctStateNames[s]; ok {
		return n
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// CTEntry is one conntrack entry. Times are on the MonotonicNow clock, to the
// second: the datapath keeps whole seconds.
type CTEntry struct {
	Flow      Flow
	BackendID uint32
	ServiceID uint32
	State     CTState
	// Tentative: created by a packet other than a TCP SYN and not confirmed by
	// a later packet yet; the short tentative timeout applies.
	Tentative bool
	LastSeen  time.Duration
	// ExpiresAt is the first instant at which the datapath no longer uses the
	// entry: LastSeen + the timeout of its state (Config) + the second that
	// LastSeen was rounded down from. Read-only: RestoreConntrack ignores it.
	ExpiresAt time.Duration
}

// Expired reports whether the entry is past its lifetime at now.
func (e CTEntry) Expired(now time.Duration) bool { return now >= e.ExpiresAt }

// ctTimeouts are the conntrack timeouts of a Config in the datapath's seconds.
type ctTimeouts struct {
	syn, est, closing, udp, tentative uint32
	sctpInit, sctpEst, sctpClosing    uint32
}

// timeouts reads the config's conntrack timeouts.
func (d *Datapath) timeouts() (ctTimeouts, error) {
	var v lbxdpLbConfig
	if err := d.objs.LbCfg.Lookup(uint32(0), &v); err != nil {
		return ctTimeouts{}, fmt.Errorf("read conntrack timeouts: %w", err)
	}
	return ctTimeouts{v.TcpSynTimeout, v.TcpEstTimeout, v.TcpCloseTimeout, v.UdpTimeout, v.TentativeTimeout,
		v.SctpInitTimeout, v.SctpEstTimeout, v.SctpCloseTimeout}, nil
}

// of returns the timeout of an entry in seconds, as lb_ct_timeout does.
func (t ctTimeouts) of(v *lbxdpLbCt) uint32 {
	if v.Flags&ctTentative != 0 {
		return t.tentative
	}
	switch CTState(v.State) {
	case CTSyn:
		return t.syn
	case CTEstablished:
		return t.est
	case CTClosing:
		return t.closing
	case CTSCTPInit, CTSCTPCookie:
		return t.sctpInit
	case CTSCTPEstablished:
		return t.sctpEst
	case CTSCTPShutdown, CTSCTPClosed:
		return t.sctpClosing
	}
	return t.udp
}

// expired reports whether the datapath treats the entry as gone at now, as
// lb_ct_usable computes it.
func (t ctTimeouts) expired(v *lbxdpLbCt, now time.Duration) bool {
	return int32(uint32(now/time.Second)-v.LastSeen) > int32(t.of(v))
}

// ctTentative is LB_CT_F_TENTATIVE (enum lb_ct_flag), in lb_ct.flags.
const ctTentative = uint8(lbxdpLbCtFlagLB_CT_F_TENTATIVE)

// ctKey is the key of one of the conntrack maps: lb_ct4's for IPv4 flows,
// lb_ct6's (lb_ct_key) for IPv6 ones.
type ctKey interface {
	lbxdpLbCt4Key | lbxdpLbCtKey
	flow() Flow
}

func (k lbxdpLbCt4Key) flow() Flow {
	return Flow{
		Src:   netip.AddrPortFrom(netip.AddrFrom4(be32Bytes(k.Saddr)), htons(k.Sport)),
		Dst:   netip.AddrPortFrom(netip.AddrFrom4(be32Bytes(k.Daddr)), htons(k.Dport)),
		Proto: k.Proto,
	}
}

func (k lbxdpLbCtKey) flow() Flow {
	return Flow{
		Src:   netip.AddrPortFrom(bytesAddr(k.Saddr, k.Family), htons(k.Sport)),
		Dst:   netip.AddrPortFrom(bytesAddr(k.Daddr, k.Family), htons(k.Dport)),
		Proto: k.Proto,
	}
}

// be32Bytes is a __be32 as the generated code holds it (read in host order) back
// to its bytes.
func be32Bytes(v uint32) [4]byte {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], v)
	return b
}

// keys sorts flows into the keys of the two maps.
type ctKeys struct {
	v4 []lbxdpLbCt4Key
	v6 []lbxdpLbCtKey
}

func (ks *ctKeys) add(f Flow) error {
	src, fam, err := addrBytes(f.Src.Addr())
	if err != nil {
		return err
	}
	dst, dfam, err := addrBytes(f.Dst.Addr())
	if err != nil {
		return err
	}
	if fam != dfam {
		return fmt.Errorf("flow %v -> %v: %w", f.Src, f.Dst, ErrFamily)
	}
	if fam == familyV4 {
		ks.v4 = append(ks.v4, lbxdpLbCt4Key{
			Saddr: binary.NativeEndian.Uint32(src[:4]), Daddr: binary.NativeEndian.Uint32(dst[:4]),
			Sport: htons(f.Src.Port()), Dport: htons(f.Dst.Port()), Proto: f.Proto,
		})
		return nil
	}
	ks.v6 = append(ks.v6, lbxdpLbCtKey{Saddr: src, Daddr: dst, Sport: htons(f.Src.Port()),
		Dport: htons(f.Dst.Port()), Proto: f.Proto, Family: familyV6})
	return nil
}

func (t ctTimeouts) entry(f Flow, v *lbxdpLbCt) CTEntry {
	return CTEntry{
		Flow:      f,
		BackendID: v.BackendId,
		ServiceID: v.ServiceId,
		State:     CTState(v.State),
		Tentative: v.Flags&ctTentative != 0,
		LastSeen:  time.Duration(v.LastSeen) * time.Second,
		ExpiresAt: time.Duration(uint64(v.LastSeen)+uint64(t.of(v))+1) * time.Second,
	}
}

// conntrackBatch is how many entries one batch syscall moves.
const conntrackBatch = 4096

// scanCT reads a conntrack map in batches and calls fn for every entry until fn
// returns false. A batch lookup walks the hash bucket by bucket under the bucket's
// lock: entries added or removed meanwhile never make it start over or give up,
// and none is seen twice.
func scanCT[K ctKey](m *ebpf.Map, fn func(*K, *lbxdpLbCt) bool) error {
	keys := make([]K, conntrackBatch)
	vals := make([]lbxdpLbCt, conntrackBatch)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			if !fn(&keys[i], &vals[i]) {
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

// Conntrack calls fn for every conntrack entry, IPv4 flows first, reading the maps
// in batches, until fn returns false. Entries added or removed meanwhile may or may
// not be seen.
func (d *Datapath) Conntrack(fn func(CTEntry) bool) error {
	t, err := d.timeouts()
	if err != nil {
		return err
	}
	more := true
	err = scanCT(d.objs.LbCt4, func(k *lbxdpLbCt4Key, v *lbxdpLbCt) bool {
		more = fn(t.entry(k.flow(), v))
		return more
	})
	if err != nil || !more {
		return err
	}
	return scanCT(d.objs.LbCt6, func(k *lbxdpLbCtKey, v *lbxdpLbCt) bool { return fn(t.entry(k.flow(), v)) })
}

// ConntrackLookup returns the entry of one flow; ok is false if there is none.
func (d *Datapath) ConntrackLookup(f Flow) (e CTEntry, ok bool, err error) {
	var ks ctKeys
	if err := ks.add(f); err != nil {
		return CTEntry{}, false, fmt.Errorf("look up conntrack: %w", err)
	}
	t, err := d.timeouts()
	if err != nil {
		return CTEntry{}, false, err
	}
	var v lbxdpLbCt
	if len(ks.v4) > 0 {
		err = d.objs.LbCt4.Lookup(&ks.v4[0], &v)
	} else {
		err = d.objs.LbCt6.Lookup(&ks.v6[0], &v)
	}
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return CTEntry{}, false, nil
	}
	if err != nil {
		return CTEntry{}, false, fmt.Errorf("look up conntrack: %w", err)
	}
	return t.entry(f, &v), true, nil
}

// DeleteConntrack deletes the entries of the given flows in batches and
// returns how many existed.
func (d *Datapath) DeleteConntrack(flows []Flow) (int, error) {
	var ks ctKeys
	for _, f := range flows {
		if err := ks.add(f); err != nil {
			return 0, fmt.Errorf("delete conntrack: %w", err)
		}
	}
	return d.deleteCT(ks)
}

func (d *Datapath) deleteCT(ks ctKeys) (int, error) {
	n4, err := deleteCTKeys(d.objs.LbCt4, ks.v4)
	if err != nil {
		return n4, err
	}
	n6, err := deleteCTKeys(d.objs.LbCt6, ks.v6)
	return n4 + n6, err
}

// deleteCTKeys deletes keys in batches. A batch stops at the first missing key
// (the collector or another caller may have deleted it meanwhile), so the rest
// of that batch is retried one by one.
func deleteCTKeys[K ctKey](m *ebpf.Map, keys []K) (int, error) {
	deleted := 0
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), conntrackBatch)]
		keys = keys[len(chunk):]
		n, err := m.BatchDelete(chunk, nil)
		deleted += n
		if err == nil {
			continue
		}
		if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return deleted, fmt.Errorf("delete conntrack: %w", err)
		}
		for i := n + 1; i < len(chunk); i++ {
			err := m.Delete(&chunk[i])
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
// returns how many were deleted. Disabling a backend passes a backend-ID test.
func (d *Datapath) DeleteConntrackWhere(match func(CTEntry) bool) (int, error) {
	var ks ctKeys
	err := d.Conntrack(func(e CTEntry) bool {
		if match(e) {
			_ = ks.add(e.Flow) // a listed flow always has a valid key
		}
		return true
	})
	if err != nil {
		return 0, err
	}
	return d.deleteCT(ks)
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
