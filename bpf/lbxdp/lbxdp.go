//go:build linux

// Package lbxdp loads the LB-node XDP datapath (lbxdp.c) and gives typed access
// to every map it uses, so that callers never handle raw map bytes.
//
// The program handles packets to a VIP service: it picks a backend (conntrack,
// then session affinity, then the service's Maglev table), DNATs the client's
// packet to the backend and sends it, wrapped in Geneve with the DSR option of
// docs/wire-format.md, to the backend's node via a FIB lookup (XDP_TX when the route
// leaves by the ingress port, a redirect otherwise). Everything else passes to
// the kernel.
//
// Behaviour worth knowing:
//   - IP fragments of VIP traffic are dropped and counted (DropFragment):
//     without reassembly only the first fragment carries the ports, so later
//     fragments could not follow it to the same backend. Clients rely on path
//     MTU discovery, which the too-big replies support.
//   - A packet that would exceed the egress MTU once encapsulated is answered
//     with ICMP "fragmentation needed" (IPv4 with DF) or ICMPv6 "packet too big"
//     carrying the egress MTU minus the encapsulation overhead; an IPv4 packet
//     without DF cannot be signalled and is dropped (DropTooBigUnsignaled).
//   - A new flow to a service without a usable backend is answered with a TCP
//     RST or an ICMP/ICMPv6 port unreachable, or dropped if the service has
//     DropNoBackend set.
//   - Frames with inconsistent headers are dropped (DropMalformed), whatever
//     their destination: the kernel would drop them too.
//   - ICMP errors about a VIP flow are forwarded to that flow's backend, with
//     the outer destination and the embedded source rewritten to the backend.
//   - FIB results toward backend nodes (next hop, outer source, route MTU) are
//     cached per CPU for half a second; FlushRouteCache applies a route or
//     neighbour change at once. Only locked route MTUs ("mtu lock") are seen
//     by the FIB helper; otherwise the device MTU applies.
//
// # Fast paths
//
// Most packets are either not for a VIP or belong to an established flow;
// the program spends as few map lookups on them as it can, with the same
// outcome as the full path:
//   - A bitmap of destination-address buckets (lb_vip_filter, 65536 buckets)
//     passes most traffic for other addresses without a hash lookup; an
//     address in a VIP's bucket is confirmed in lb_vips before anything is
//     dropped or answered for it.
//   - Conntrack is looked up first. When the entry's service (by ID, from
//     lb_svc_by_id) still has exactly the packet's destination as key, the
//     lb_vips and lb_services lookups are skipped; flows of wildcard-port
//     services, and entries whose service was deleted, re-keyed or replaced,
//     take the full path. The entry also keeps 16 bits of the flow hash (outer
//     source port and flow label), refreshed with the timestamp.
//
// Both indexes are written by UpsertService and DeleteService and rebuilt at
// Load; one Datapath must be the only writer of a set of maps (the filter's
// per-bucket counts live in memory).
//
// # Conntrack
//
// Two plain hash maps, not LRUs: lb_ct4 for IPv4 flows (16-byte keys, preallocated)
// and lb_ct6 for IPv6 ones (entries allocated as they come), each sized a quarter
// above Options.ConntrackSize. An insert never evicts another flow; a new flow costs
// one insert (BPF_NOEXIST) and no lookup. An entry is 16 bytes: backend and service
// IDs, the last-seen time in whole seconds of CLOCK_MONOTONIC (the coarse clock, read
// once per jiffy and CPU, comparable with MonotonicNow; rewritten at most once a
// second per flow), 16 bits of the flow hash, the state and a tentative flag.
//
// An entry expires when idle longer than the timeout of its state, from Config: TCP
// SYN seen, established, closing (FIN or RST seen), UDP; and TentativeTimeout while
// tentative, that is created by a packet other than a TCP SYN (a flow picked up
// mid-connection, a first UDP datagram) and not yet confirmed by a later packet. The
// datapath ignores an expired entry (the flow is balanced again, the entry replaced)
// and a closing entry hit by a new SYN. SweepConntrack deletes expired entries and,
// over capacity, reclaims unconfirmed and closing ones; it never cuts an established
// flow short.
//
// The flood guard (Config.GuardRate) lets each CPU record at most that many new flows
// a second; past it new flows are balanced by the Maglev table alone. ConntrackEvents
// counts inserts, tentative inserts, confirmations, guard skips and engagements,
// failed inserts (a full map) and reclaims.
//
// Affinity entries hold CLOCK_MONOTONIC_COARSE nanoseconds and expire
// AffinityTimeout after LastSeen, which is refreshed each time the client opens a new
// flow.
package lbxdp

import (
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Default map sizes, used when an Options field is zero: the sizes compiled into the
// program (enum lb_default), as bpf2go generates them.
const (
	DefaultMaxServices     = uint32(lbxdpLbDefaultLB_DEFAULT_MAX_SERVICES)
	DefaultMaxBackends     = uint32(lbxdpLbDefaultLB_DEFAULT_MAX_BACKENDS)
	DefaultConntrackSize   = uint32(lbxdpLbDefaultLB_DEFAULT_CT_FLOWS)
	DefaultAffinitySize    = uint32(lbxdpLbDefaultLB_DEFAULT_AFF_SIZE)
	DefaultSourceRangeSize = uint32(lbxdpLbDefaultLB_DEFAULT_SRC_SIZE)
	// MaxTableSize bounds a Maglev table (go-maglev's tables are far smaller).
	MaxTableSize = 1 << 24
)

// Options configure Load. Zero values take the defaults above.
type Options struct {
	// PinPath is a bpffs directory. When set, every map is pinned there by name
	// and maps already pinned there are reused, so a restarted daemon adopts
	// the running datapath's state. It must exist.
	PinPath string
	// MaxServices bounds service IDs (IDs are 0..MaxServices-1).
	MaxServices uint32
	// MaxBackends bounds backend IDs (IDs are 1..MaxBackends-1; 0 means none).
	MaxBackends uint32
	// ConntrackSize is the number of flows conntrack is sized for: its map holds a
	// quarter more (ConntrackEntries), headroom that SweepConntrack gives back.
	ConntrackSize uint32
	// AffinitySize is the number of client entries the LRU affinity map holds.
	AffinitySize uint32
	// SourceRangeSize is the number of allowed source prefixes over all services.
	SourceRangeSize uint32
}

func (o *Options) setDefaults() {
	if o.MaxServices == 0 {
		o.MaxServices = DefaultMaxServices
	}
	if o.MaxBackends == 0 {
		o.MaxBackends = DefaultMaxBackends
	}
	if o.ConntrackSize == 0 {
		o.ConntrackSize = DefaultConntrackSize
	}
	if o.AffinitySize == 0 {
		o.AffinitySize = DefaultAffinitySize
	}
	if o.SourceRangeSize == 0 {
		o.SourceRangeSize = DefaultSourceRangeSize
	}
}

// Datapath is a loaded instance of the XDP program and its maps.
//
// Its methods are not safe for concurrent use.
type Datapath struct {
	objs        lbxdpObjects
	opts        Options
	maglevInner *ebpf.MapSpec
	filter      vipFilter
	// ctReclaimed counts live conntrack entries the collector reclaimed
	// (SweepConntrack); read by ConntrackEvents from any goroutine.
	ctReclaimed atomic.Uint64
	// writes counts the entries written to the maps filled from the desired state
	// (Writes).
	writes atomic.Uint64
	// tableHeader is what the kernel charges for a table map besides its elements.
	tableHeader uint64
}

// Writes is the number of map entries this Datapath has written (updated or deleted)
// in the maps it fills from the desired state: services, VIPs and their indexes,
// backends, Maglev tables (each element, and each swap of a table map), source ranges
// and the configuration. Learned state (conntrack, affinity) and counters are not
// counted. Safe for concurrent use.
func (d *Datapath) Writes() uint64 { return d.writes.Load() }

// update writes one entry of a map filled from the desired state, and counts it.
func (d *Datapath) update(m *ebpf.Map, key, value any, flags ebpf.MapUpdateFlags) error {
	if err := m.Update(key, value, flags); err != nil {
		return err
	}
	d.writes.Add(1)
	return nil
}

// delete removes one entry of a map filled from the desired state, and counts it.
func (d *Datapath) delete(m *ebpf.Map, key any) error {
	if err := m.Delete(key); err != nil {
		return err
	}
	d.writes.Add(1)
	return nil
}

// Load loads the program and creates (or, with PinPath, adopts) its maps. A
// verifier error is returned whole: print it with %+v to see the log.
func Load(opts Options) (*Datapath, error) {
	opts.setDefaults()
	spec, err := Spec(opts)
	if err != nil {
		return nil, err
	}
	d := &Datapath{opts: opts, maglevInner: spec.Maps[lbxdpMapLbTables].InnerMap.Copy()}
	// Table maps are created without BTF: with it, every map creation also loads its
	// key and value types into the kernel (a BTF object per table, about a third of
	// a table map's creation cost at 10,000 services). The kernel does not compare
	// inner maps' BTF, and nothing reads a table map by its types.
	d.maglevInner.Key, d.maglevInner.Value = nil, nil
	err = spec.LoadAndAssign(&d.objs, &ebpf.CollectionOptions{
		Maps: ebpf.MapOptions{PinPath: opts.PinPath},
	})
	if err != nil {
		return nil, fmt.Errorf("load lbxdp objects: %w", err)
	}
	if err := d.rebuildIndexes(); err != nil {
		d.Close()
		return nil, err
	}
	if err := d.measureTableHeader(); err != nil {
		d.Close()
		return nil, err
	}
	cfg, err := d.Config()
	if err != nil {
		d.Close()
		return nil, err
	}
	// A fresh config map is all zeros; an adopted one keeps the running config.
	if cfg == (Config{}) {
		if err := d.SetConfig(DefaultConfig()); err != nil {
			d.Close()
			return nil, err
		}
	}
	return d, nil
}

// Close releases the program and map handles. Pinned maps stay in bpffs.
func (d *Datapath) Close() error {
	if err := d.objs.Close(); err != nil {
		return fmt.Errorf("close lbxdp objects: %w", err)
	}
	return nil
}

// Program returns the XDP program (for attaching or test runs). It stays owned
// by the Datapath.
func (d *Datapath) Program() *ebpf.Program { return d.objs.LbXdp }

// StateMaps returns the maps of lbstate.h by name: the service state that the socket-level
// programs (bpf/socklb) read too. They stay owned by the Datapath, the only writer.
func (d *Datapath) StateMaps() map[string]*ebpf.Map {
	return map[string]*ebpf.Map{
		lbxdpMapLbVips:     d.objs.LbVips,
		lbxdpMapLbServices: d.objs.LbServices,
		lbxdpMapLbTables:   d.objs.LbTables,
		lbxdpMapLbBackends: d.objs.LbBackends,
		lbxdpMapLbCfg:      d.objs.LbCfg,
	}
}

// Options returns the options the Datapath was loaded with, defaults filled in.
func (d *Datapath) Options() Options { return d.opts }

// Attach attaches the program to an interface in native (driver) mode. Native
// mode is required: generic mode hides checksum and XDP_TX problems.
func (d *Datapath) Attach(ifindex int) (link.Link, error) {
	l, err := link.AttachXDP(link.XDPOptions{
		Program:   d.objs.LbXdp,
		Interface: ifindex,
		Flags:     link.XDPDriverMode,
	})
	if err != nil {
		return nil, fmt.Errorf("attach xdp to ifindex %d: %w", ifindex, err)
	}
	return l, nil
}

// MonotonicNow reads the clock of conntrack and affinity timestamps.
func MonotonicNow() time.Duration {
	var ts unix.Timespec
	// CLOCK_MONOTONIC cannot fail on Linux.
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}

// Address families as stored in map keys.
const (
	familyV4 = 4
	familyV6 = 6
)

// ErrFamily reports an address that is neither IPv4 nor IPv6, or a mismatch
// between families that must agree.
var ErrFamily = errors.New("invalid address family")

// ErrRange reports an ID or size outside the bounds the maps were created with.
var ErrRange = errors.New("out of range")

func addrBytes(a netip.Addr) (b [16]byte, family uint8, err error) {
	switch {
	case a.Is4():
		v := a.As4()
		copy(b[:], v[:])
		return b, familyV4, nil
	case a.Is6() && !a.Is4In6():
		return a.As16(), familyV6, nil
	}
	return b, 0, fmt.Errorf("address %v: %w", a, ErrFamily)
}

func bytesAddr(b [16]byte, family uint8) netip.Addr {
	if family == familyV4 {
		return netip.AddrFrom4([4]byte(b[:4]))
	}
	if family == familyV6 {
		return netip.AddrFrom16(b)
	}
	return netip.Addr{}
}

// htons converts a port to the network-order value the maps store in a
// native-endian uint16 field.
func htons(v uint16) uint16 { return v<<8 | v>>8 }
