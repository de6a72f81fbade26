//go:build linux

package backendtc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Config is the datapath's run-time configuration.
type Config struct {
	// VNI is the Geneve VNI accepted on ingress (24 bits); frames with another VNI
	// are not lbd's and pass to the kernel unchanged (CounterPassForeign).
	VNI uint32
}

// DefaultConfig is the configuration docs/wire-format.md describes.
func DefaultConfig() Config { return Config{VNI: 2} }

// SetConfig replaces the configuration; packets see the new one at once.
func (d *Datapath) SetConfig(c Config) error {
	if c.VNI >= 1<<24 {
		return fmt.Errorf("set config: VNI %d does not fit in 24 bits", c.VNI)
	}
	v := backendtcConfig{Vni: c.VNI}
	if err := d.objs.BetcConfig.Put(uint32(0), &v); err != nil {
		return fmt.Errorf("set config: %w", err)
	}
	return nil
}

// Config reads the configuration back.
func (d *Datapath) Config() (Config, error) {
	var v backendtcConfig
	if err := d.objs.BetcConfig.Lookup(uint32(0), &v); err != nil {
		return Config{}, fmt.Errorf("read config: %w", err)
	}
	return Config{VNI: v.Vni}, nil
}

// lpmKey stores IPv4 prefixes IPv4-mapped, as the program looks them up.
func lpmKey(p netip.Prefix) (backendtcLpmKey, error) {
	if !p.IsValid() {
		return backendtcLpmKey{}, fmt.Errorf("invalid prefix %v", p)
	}
	p = p.Masked()
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	return backendtcLpmKey{Prefixlen: uint32(bits), Addr: p.Addr().As16()}, nil
}

// AddAllowedSource lets Geneve frames whose outer source is in p be decapsulated.
func (d *Datapath) AddAllowedSource(p netip.Prefix) error {
	k, err := lpmKey(p)
	if err != nil {
		return fmt.Errorf("add allowed source: %w", err)
	}
	if err := d.objs.BetcAllowed.Put(&k, uint8(1)); err != nil {
		return fmt.Errorf("add allowed source %v: %w", p, err)
	}
	return nil
}

// DeleteAllowedSource removes a prefix added by AddAllowedSource; ErrNotFound if
// it is not there.
func (d *Datapath) DeleteAllowedSource(p netip.Prefix) error {
	k, err := lpmKey(p)
	if err != nil {
		return fmt.Errorf("delete allowed source: %w", err)
	}
	if err := d.objs.BetcAllowed.Delete(&k); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete allowed source %v: %w", p, ErrNotFound)
		}
		return fmt.Errorf("delete allowed source %v: %w", p, err)
	}
	return nil
}

// AllowedSources lists the allowed LB source prefixes.
func (d *Datapath) AllowedSources() ([]netip.Prefix, error) {
	var (
		k   backendtcLpmKey
		v   uint8
		out []netip.Prefix
	)
	it := d.objs.BetcAllowed.Iterate()
	for it.Next(&k, &v) {
		addr := netip.AddrFrom16(k.Addr)
		bits := int(k.Prefixlen)
		if addr.Is4In6() && bits >= 96 {
			addr = addr.Unmap()
			bits -= 96
		}
		out = append(out, netip.PrefixFrom(addr, bits))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list allowed sources: %w", err)
	}
	return out, nil
}

// Proto is an IP protocol number.
type Proto uint8

// Protocols that have NAT entries.
const (
	ProtoTCP  Proto = 6
	ProtoUDP  Proto = 17
	ProtoSCTP Proto = 132
)

// String is the protocol's lower-case name.
func (p Proto) String() string {
	switch p {
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	case ProtoSCTP:
		return "sctp"
	}
	return fmt.Sprintf("proto(%d)", uint8(p))
}

// NATKey identifies a backend flow as the backend node sees it: the DNAT'ed
// destination (Backend) and the client.
type NATKey struct {
	Proto   Proto
	Backend netip.AddrPort
	Client  netip.AddrPort
}

// NATEntry is one NAT entry.
//
// Lifetime encoding: LastSeen is the time of the last packet of the flow in either
// direction, kept with a granularity of one second (the datapath rewrites it at most
// once a second). Closing is set when a TCP FIN or RST was seen in either direction
// and cleared by a new SYN on the same tuple; a closing entry should expire after a
// short timeout instead of the idle one, see Expired.
type NATEntry struct {
	NATKey
	VIP      netip.AddrPort
	Closing  bool
	LastSeen time.Time
	// Idle is how long ago LastSeen was when the entry was read, from the kernel's
	// boot clock, so it is immune to wall-clock changes.
	Idle time.Duration
}

// Expired reports whether the entry has been idle for longer than its timeout:
// closingTimeout for closing TCP entries, idleTimeout otherwise.
func (e NATEntry) Expired(idleTimeout, closingTimeout time.Duration) bool {
	if e.Closing {
		return e.Idle > closingTimeout
	}
	return e.Idle > idleTimeout
}

// netPort converts between a port in network order stored in a host-order field and
// its value; the conversion is its own inverse.
func netPort(p uint16) uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], p)
	return binary.BigEndian.Uint16(b[:])
}

func addrFamily(a netip.Addr) (raw [16]byte, family uint8) {
	if a.Is4() {
		v4 := a.As4()
		copy(raw[:], v4[:])
		return raw, 4
	}
	return a.As16(), 6
}

func addrFromRaw(raw [16]byte, family uint8) netip.Addr {
	if family == 4 {
		return netip.AddrFrom4([4]byte(raw[:4]))
	}
	return netip.AddrFrom16(raw)
}

func natKey(k NATKey) (backendtcNatKey, error) {
	b, fb := addrFamily(k.Backend.Addr().Unmap())
	c, fc := addrFamily(k.Client.Addr().Unmap())
	if !k.Backend.IsValid() || !k.Client.IsValid() || fb != fc {
		return backendtcNatKey{}, fmt.Errorf("invalid NAT key %v %v -> %v", k.Proto, k.Client, k.Backend)
	}
	return backendtcNatKey{
		Backend:     b,
		Client:      c,
		BackendPort: netPort(k.Backend.Port()),
		ClientPort:  netPort(k.Client.Port()),
		Proto:       uint8(k.Proto),
		Family:      fb,
	}, nil
}

// bootNow reads CLOCK_BOOTTIME, the clock of bpf_ktime_get_boot_ns.
func bootNow() (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0, fmt.Errorf("read boot clock: %w", err)
	}
	return time.Duration(ts.Nano()), nil
}

func natEntry(k backendtcNatKey, v backendtcNatVal, wall time.Time, boot time.Duration) NATEntry {
	idle := max(boot-time.Duration(v.LastSeen), 0)
	return NATEntry{
		NATKey: NATKey{
			Proto:   Proto(k.Proto),
			Backend: netip.AddrPortFrom(addrFromRaw(k.Backend, k.Family), netPort(k.BackendPort)),
			Client:  netip.AddrPortFrom(addrFromRaw(k.Client, k.Family), netPort(k.ClientPort)),
		},
		VIP:      netip.AddrPortFrom(addrFromRaw(v.Vip, v.Family), netPort(v.VipPort)),
		Closing:  v.Flags&natFlagClosing != 0,
		LastSeen: wall.Add(-idle),
		Idle:     idle,
	}
}

// natFlagClosing is LBD_NAT_F_CLOSING (enum betc_nat_flag), as bpf2go generates it.
const natFlagClosing = uint8(backendtcBetcNatFlagLBD_NAT_F_CLOSING)

// LookupNAT returns the entry for k, or ErrNotFound.
func (d *Datapath) LookupNAT(k NATKey) (NATEntry, error) {
	raw, err := natKey(k)
	if err != nil {
		return NATEntry{}, fmt.Errorf("lookup NAT entry: %w", err)
	}
	var v backendtcNatVal
	if err := d.objs.BetcNat.Lookup(&raw, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return NATEntry{}, fmt.Errorf("lookup NAT entry: %w", ErrNotFound)
		}
		return NATEntry{}, fmt.Errorf("lookup NAT entry: %w", err)
	}
	boot, err := bootNow()
	if err != nil {
		return NATEntry{}, err
	}
	return natEntry(raw, v, time.Now(), boot), nil
}

// natBatch is the number of entries read per BPF_MAP_LOOKUP_BATCH call.
const natBatch = 4096

// NATEntries lists every NAT entry, reading the table in batches. Entries written
// while it runs may or may not be listed.
func (d *Datapath) NATEntries() ([]NATEntry, error) {
	boot, err := bootNow()
	if err != nil {
		return nil, err
	}
	wall := time.Now()
	var (
		cursor ebpf.MapBatchCursor
		keys   = make([]backendtcNatKey, natBatch)
		vals   = make([]backendtcNatVal, natBatch)
		out    []NATEntry
	)
	for {
		n, err := d.objs.BetcNat.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			out = append(out, natEntry(keys[i], vals[i], wall, boot))
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list NAT entries: %w", err)
		}
	}
}

// DeleteNAT removes the given entries in one batch and returns how many were
// deleted. Keys that are not in the table are skipped.
func (d *Datapath) DeleteNAT(keys []NATKey) (int, error) {
	raw := make([]backendtcNatKey, 0, len(keys))
	for _, k := range keys {
		r, err := natKey(k)
		if err != nil {
			return 0, fmt.Errorf("delete NAT entries: %w", err)
		}
		raw = append(raw, r)
	}
	deleted := 0
	for len(raw) > 0 {
		n, err := d.objs.BetcNat.BatchDelete(raw, nil)
		deleted += n
		if err == nil {
			return deleted, nil
		}
		if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return deleted, fmt.Errorf("delete NAT entries: %w", err)
		}
		// The batch stops at the first missing key; skip it and go on.
		raw = raw[n+1:]
	}
	return deleted, nil
}

// Counter is a datapath event counted per CPU.
type Counter uint32

// Counters: enum counter in backendtc.h (which says what each counts), as bpf2go
// generates it. Ingress decapsulates only lbd's Geneve: a version 0 header with the
// configured VNI and lbd's DSR option among the options. Other UDP to port 6081 is
// passed to the kernel unchanged and counted as CounterPassForeign; the drop
// counters, from CounterDropNotAllowed on, count only packets that are lbd's (or
// claim to be).
const (
	CounterDecapOK             = Counter(backendtcCounterCNT_DECAP_OK)
	CounterDecapNoNAT          = Counter(backendtcCounterCNT_DECAP_NO_NAT)
	CounterNATCreated          = Counter(backendtcCounterCNT_NAT_CREATED)
	CounterNATRefreshed        = Counter(backendtcCounterCNT_NAT_REFRESHED)
	CounterNATReplaced         = Counter(backendtcCounterCNT_NAT_REPLACED)
	CounterNATClosing          = Counter(backendtcCounterCNT_NAT_CLOSING)
	CounterSNATDone            = Counter(backendtcCounterCNT_SNAT_DONE)
	CounterICMPTranslated      = Counter(backendtcCounterCNT_ICMP_TRANSLATED)
	CounterPassFragment        = Counter(backendtcCounterCNT_PASS_FRAGMENT)
	CounterPassForeign         = Counter(backendtcCounterCNT_PASS_FOREIGN)
	CounterDropNotAllowed      = Counter(backendtcCounterCNT_DROP_NOT_ALLOWED)
	CounterDropMalformedOption = Counter(backendtcCounterCNT_DROP_MALFORMED_OPT)
	CounterDropUnknownCritical = Counter(backendtcCounterCNT_DROP_UNKNOWN_CRITICAL)
	CounterDropBadLength       = Counter(backendtcCounterCNT_DROP_BAD_LEN)
	CounterDropBadGeneve       = Counter(backendtcCounterCNT_DROP_BAD_GENEVE)
	CounterDropBadInner        = Counter(backendtcCounterCNT_DROP_BAD_INNER)
	CounterDropDecapFailed     = Counter(backendtcCounterCNT_DROP_DECAP_FAILED)
	CounterDropNATFailed       = Counter(backendtcCounterCNT_DROP_NAT_FAILED)
	CounterDropSNATFailed      = Counter(backendtcCounterCNT_DROP_SNAT_FAILED)
	numCounters                = Counter(backendtcCounterCNT_MAX)
)

// counterNames names every counter; a counter of the C enum without a name here
// fails the package's tests.
var counterNames = [numCounters]string{
	CounterDecapOK:             "decap_ok",
	CounterDecapNoNAT:          "decap_no_nat",
	CounterNATCreated:          "nat_created",
	CounterNATRefreshed:        "nat_refreshed",
	CounterNATReplaced:         "nat_replaced",
	CounterNATClosing:          "nat_closing",
	CounterSNATDone:            "snat_done",
	CounterICMPTranslated:      "icmp_translated",
	CounterPassFragment:        "pass_fragment",
	CounterPassForeign:         "pass_foreign",
	CounterDropNotAllowed:      "drop_not_allowed",
	CounterDropMalformedOption: "drop_malformed_option",
	CounterDropUnknownCritical: "drop_unknown_critical_option",
	CounterDropBadLength:       "drop_bad_length",
	CounterDropBadGeneve:       "drop_bad_geneve",
	CounterDropBadInner:        "drop_bad_inner",
	CounterDropDecapFailed:     "drop_decap_failed",
	CounterDropNATFailed:       "drop_nat_failed",
	CounterDropSNATFailed:      "drop_snat_failed",
}

// String is the counter's metric-friendly name.
func (c Counter) String() string {
	if c < numCounters && counterNames[c] != "" {
		return counterNames[c]
	}
	return fmt.Sprintf("counter(%d)", uint32(c))
}

// AllCounters lists every counter, in order.
func AllCounters() []Counter {
	out := make([]Counter, numCounters)
	for i := range out {
		out[i] = Counter(i)
	}
	return out
}

// Counters returns every counter summed over CPUs.
func (d *Datapath) Counters() (map[Counter]uint64, error) {
	out := make(map[Counter]uint64, numCounters)
	var perCPU []uint64
	for _, c := range AllCounters() {
		if err := d.objs.BetcCounters.Lookup(uint32(c), &perCPU); err != nil {
			return nil, fmt.Errorf("read counter %v: %w", c, err)
		}
		var sum uint64
		for _, v := range perCPU {
			sum += v
		}
		out[c] = sum
	}
	return out, nil
}
