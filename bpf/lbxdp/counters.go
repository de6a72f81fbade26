//go:build linux

package lbxdp

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// Counters are summed over CPUs. Bytes count the client's IP packets (without
// link-layer or tunnel headers).
type Counters struct {
	Packets  uint64
	Bytes    uint64
	NewFlows uint64
}

// DropReason says why the datapath dropped a packet: enum lb_drop_reason.
type DropReason uint32

// Drop reasons, as bpf2go generates them. Rejected and TooBig packets are dropped but
// answered; a PassNoNeighbour packet is forwarded through the kernel.
const (
	DropMalformed        = DropReason(lbxdpLbDropReasonLB_DROP_MALFORMED)          // inconsistent or truncated headers
	DropFragment         = DropReason(lbxdpLbDropReasonLB_DROP_FRAGMENT)           // IP fragment of VIP traffic
	DropSourceRange      = DropReason(lbxdpLbDropReasonLB_DROP_SRC_RANGE)          // client outside the service's source ranges
	DropNoBackend        = DropReason(lbxdpLbDropReasonLB_DROP_NO_BACKEND)         // no usable backend, service drops silently
	DropRejected         = DropReason(lbxdpLbDropReasonLB_DROP_REJECTED)           // no usable backend, answered with RST / port unreachable
	DropTooBig           = DropReason(lbxdpLbDropReasonLB_DROP_TOO_BIG)            // too big once encapsulated, answered with ICMP
	DropTooBigUnsignaled = DropReason(lbxdpLbDropReasonLB_DROP_TOO_BIG_UNSIGNALED) // too big and no ICMP possible (IPv4 without DF, ICMP errors)
	DropFIB              = DropReason(lbxdpLbDropReasonLB_DROP_FIB)                // FIB lookup failed otherwise (forwarding off on the ingress device, ...)
	DropInternal         = DropReason(lbxdpLbDropReasonLB_DROP_INTERNAL)           // a packet-resizing helper failed
	DropNoRoute          = DropReason(lbxdpLbDropReasonLB_DROP_FIB_NO_ROUTE)       // no route (or an unreachable one) toward the backend's node
	PassNoNeighbour      = DropReason(lbxdpLbDropReasonLB_PASS_NO_NEIGH)           // next hop unresolved: encapsulated and passed to the kernel
	DropNoService        = DropReason(lbxdpLbDropReasonLB_DROP_NO_SERVICE)         // for a VIP, but no service on its port and protocol
	DropExtHeaders       = DropReason(lbxdpLbDropReasonLB_DROP_EXTHDRS)            // IPv6 to a VIP with more extension headers than followed
	dropReasons          = DropReason(lbxdpLbDropReasonLB_DROP_MAX)
)

// dropNames names every reason, in statistics and metrics; a reason of the C enum
// without a name here fails the package's tests.
var dropNames = [dropReasons]string{
	DropMalformed:        "malformed",
	DropFragment:         "fragment",
	DropSourceRange:      "source_range",
	DropNoBackend:        "no_backend",
	DropRejected:         "rejected",
	DropTooBig:           "too_big",
	DropTooBigUnsignaled: "too_big_unsignaled",
	DropFIB:              "fib",
	DropInternal:         "internal",
	DropNoRoute:          "fib_no_route",
	PassNoNeighbour:      "no_neighbour",
	DropNoService:        "no_service",
	DropExtHeaders:       "ipv6_ext_headers",
}

func (r DropReason) String() string {
	if r < dropReasons && dropNames[r] != "" {
		return dropNames[r]
	}
	return fmt.Sprintf("drop(%d)", uint32(r))
}

// Passed reports whether packets of this reason are forwarded rather than dropped.
func (r DropReason) Passed() bool { return r == PassNoNeighbour }

// CounterName is the reason's name in statistics and metrics: lb_drop_<reason>,
// or lb_pass_<reason> for packets that were forwarded after all.
func (r DropReason) CounterName() string {
	if r.Passed() {
		return "lb_pass_" + r.String()
	}
	return "lb_drop_" + r.String()
}

// DropReasons lists every reason, in order.
func DropReasons() []DropReason {
	out := make([]DropReason, dropReasons)
	for i := range out {
		out[i] = DropReason(i)
	}
	return out
}

func sumPerCPU(m *ebpf.Map, id uint32) (Counters, error) {
	var per []lbxdpLbCounter
	if err := m.Lookup(id, &per); err != nil {
		return Counters{}, err
	}
	var c Counters
	for _, p := range per {
		c.Packets += p.Packets
		c.Bytes += p.Bytes
		c.NewFlows += p.NewFlows
	}
	return c, nil
}

// ServiceCounters returns a service's packets, bytes and new flows.
func (d *Datapath) ServiceCounters(serviceID uint32) (Counters, error) {
	c, err := sumPerCPU(d.objs.LbSvcStats, serviceID)
	if err != nil {
		return Counters{}, fmt.Errorf("read service %d counters: %w", serviceID, err)
	}
	return c, nil
}

// BackendCounters returns the packets, bytes and new flows sent to a backend.
func (d *Datapath) BackendCounters(backendID uint32) (Counters, error) {
	c, err := sumPerCPU(d.objs.LbBeStats, backendID)
	if err != nil {
		return Counters{}, fmt.Errorf("read backend %d counters: %w", backendID, err)
	}
	return c, nil
}

// counterBatch is how many IDs one batch lookup reads: 4096 × 24 bytes per CPU.
const counterBatch = 4096

// readCounters reads the per-CPU counters of IDs 0..n-1 of an array map in batches (a
// few system calls instead of one per ID) and sums them over CPUs; the result is
// indexed by ID.
func readCounters(m *ebpf.Map, n uint32) ([]Counters, error) {
	n = min(n, m.MaxEntries())
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, err
	}
	out := make([]Counters, n)
	keys := make([]uint32, min(n, counterBatch))
	vals := make([]lbxdpLbCounter, len(keys)*ncpu)
	var cursor ebpf.MapBatchCursor
	for read := uint32(0); read < n; {
		k := min(n-read, uint32(len(keys)))
		got, err := m.BatchLookup(&cursor, keys[:k], vals[:int(k)*ncpu], nil)
		for i, id := range keys[:got] {
			if id >= n {
				continue
			}
			var c Counters
			for _, p := range vals[i*ncpu : (i+1)*ncpu] {
				c.Packets += p.Packets
				c.Bytes += p.Bytes
				c.NewFlows += p.NewFlows
			}
			out[id] = c
		}
		read += uint32(got)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// AllServiceCounters returns the counters of service IDs 0..n-1, indexed by ID.
func (d *Datapath) AllServiceCounters(n uint32) ([]Counters, error) {
	c, err := readCounters(d.objs.LbSvcStats, n)
	if err != nil {
		return nil, fmt.Errorf("read service counters: %w", err)
	}
	return c, nil
}

// AllBackendCounters returns the counters of backend IDs 0..n-1, indexed by ID.
func (d *Datapath) AllBackendCounters(n uint32) ([]Counters, error) {
	c, err := readCounters(d.objs.LbBeStats, n)
	if err != nil {
		return nil, fmt.Errorf("read backend counters: %w", err)
	}
	return c, nil
}

// DropCounters returns packets and bytes dropped, per reason.
func (d *Datapath) DropCounters() (map[DropReason]Counters, error) {
	cs, err := readCounters(d.objs.LbDropStats, uint32(dropReasons))
	if err != nil {
		return nil, fmt.Errorf("read drop counters: %w", err)
	}
	out := make(map[DropReason]Counters, dropReasons)
	for _, r := range DropReasons() {
		out[r] = cs[r]
	}
	return out, nil
}

// ResetServiceCounters zeroes the counters of a service (e.g. when its ID is
// reused).
func (d *Datapath) ResetServiceCounters(serviceID uint32) error {
	zero := make([]lbxdpLbCounter, ebpf.MustPossibleCPU())
	if err := d.objs.LbSvcStats.Update(serviceID, zero, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("reset service %d counters: %w", serviceID, err)
	}
	return nil
}

// ResetBackendCounters zeroes the counters of a backend.
func (d *Datapath) ResetBackendCounters(backendID uint32) error {
	zero := make([]lbxdpLbCounter, ebpf.MustPossibleCPU())
	if err := d.objs.LbBeStats.Update(backendID, zero, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("reset backend %d counters: %w", backendID, err)
	}
	return nil
}

// CTEvent is something conntrack did: enum lb_ct_event, then the events the
// collector counts.
type CTEvent uint32

// Conntrack events: the program's as bpf2go generates them, then the collector's.
const (
	CTInserted     = CTEvent(lbxdpLbCtEventLB_CT_EV_INSERTED)      // a new flow got an entry
	CTTentative    = CTEvent(lbxdpLbCtEventLB_CT_EV_TENTATIVE)     // ... of which a tentative one (first packet not a TCP SYN)
	CTConfirmed    = CTEvent(lbxdpLbCtEventLB_CT_EV_CONFIRMED)     // a later packet confirmed a tentative entry
	CTGuardSkipped = CTEvent(lbxdpLbCtEventLB_CT_EV_GUARD_SKIPPED) // a new flow was balanced without an entry: the guard was engaged
	CTGuardEngaged = CTEvent(lbxdpLbCtEventLB_CT_EV_GUARD_ENGAGED) // a CPU's new-flow rate crossed Config.GuardRate (once a second at most)
	CTInsertFailed = CTEvent(lbxdpLbCtEventLB_CT_EV_INSERT_FAILED) // no entry could be written (the map was full)
	ctKernelEvents = CTEvent(lbxdpLbCtEventLB_CT_EV_MAX)
	CTReclaimed    = ctKernelEvents // live entries the collector deleted to give the headroom back
	ctEvents       = CTReclaimed + 1
)

// ctEventNames names every event; an event of the C enum without a name here fails
// the package's tests.
var ctEventNames = [ctEvents]string{
	CTInserted:     "inserted",
	CTTentative:    "tentative",
	CTConfirmed:    "confirmed",
	CTGuardSkipped: "guard_skipped",
	CTGuardEngaged: "guard_engaged",
	CTInsertFailed: "insert_failed",
	CTReclaimed:    "reclaimed",
}

func (e CTEvent) String() string {
	if e < ctEvents && ctEventNames[e] != "" {
		return ctEventNames[e]
	}
	return fmt.Sprintf("ct_event(%d)", uint32(e))
}

// CTEventCount is one event's count since the datapath's maps were created (the
// collector's since this Datapath was loaded).
type CTEventCount struct {
	Event CTEvent
	Count uint64
}

// ConntrackEvents returns every event's count, in order. Safe to call while
// another goroutine sweeps.
func (d *Datapath) ConntrackEvents() ([]CTEventCount, error) {
	out := make([]CTEventCount, 0, ctEvents)
	for e := range ctKernelEvents {
		n, err := sumEvents(d.objs.LbCtStats, uint32(e))
		if err != nil {
			return nil, fmt.Errorf("read conntrack event %v: %w", e, err)
		}
		out = append(out, CTEventCount{e, n})
	}
	return append(out, CTEventCount{CTReclaimed, d.ctReclaimed.Load()}), nil
}

// sumEvents reads one entry of a per-CPU array of event counts, summed over the CPUs.
func sumEvents(m *ebpf.Map, key uint32) (uint64, error) {
	var per []uint64
	if err := m.Lookup(key, &per); err != nil {
		return 0, err
	}
	var n uint64
	for _, p := range per {
		n += p
	}
	return n, nil
}
