//go:build linux

package lbxdp

import (
	"errors"
	"time"

	"github.com/lbd-dev/lbd/bpf/monring"
)

// MonitorSnapLen is how many bytes of a packet a monitor event carries at most.
const MonitorSnapLen = monring.SnapLen

// Monitor flags: enum lbd_mon_flag, as bpf2go generates it.
const (
	monReasons   = uint32(lbxdpLbdMonFlagLBD_MON_REASONS)
	monForwarded = uint32(lbxdpLbdMonFlagLBD_MON_FORWARDED)
)

// MonitorConfig says which packets the program reports to the monitor's ring buffer
// (monitor.h). The zero value turns the monitor off: a packet then pays one load and
// one branch for it.
type MonitorConfig struct {
	// Reasons reports packets that hit a reason (DropReason): drops, answered ones,
	// and those passed to the kernel for neighbour resolution.
	Reasons bool
	// Forwarded reports balanced packets (encapsulated toward a backend's node).
	Forwarded bool
	// Sample reports one in Sample of the packets that qualify; 0 and 1 report each.
	Sample uint32
	// Rate bounds the events a second each CPU sends, in bursts of up to Rate.
	Rate uint32
}

// SetMonitor writes the monitor's configuration; it applies from the next packet.
func (d *Datapath) SetMonitor(c MonitorConfig) error {
	v := monring.Config{Sample: c.Sample, Rate: c.Rate}
	if c.Reasons {
		v.Flags |= monReasons
	}
	if c.Forwarded {
		v.Flags |= monForwarded
	}
	return monring.Set(d.objs.LbdMon, v)
}

// MonitorCounters are the monitor's per-CPU counters, summed.
type MonitorCounters = monring.Counters

// MonitorCounters reads the monitor's counters.
func (d *Datapath) MonitorCounters() (MonitorCounters, error) {
	return monring.ReadCounters(d.objs.LbdMonCpu)
}

// MonitorEvent is one packet the program reported.
type MonitorEvent struct {
	// Time is when the program handled it, on MonotonicNow's clock.
	Time time.Duration
	// Ifindex is the interface it arrived on.
	Ifindex int
	// Len is the frame's length; Data holds its first bytes (at most MonitorSnapLen)
	// as the program left it: a dropped packet as it arrived, an answered one as the
	// answer sent back, a forwarded one encapsulated.
	Len  int
	Data []byte
	// Reason is why it left the forwarding path, when HasReason; a forwarded packet has none.
	Reason    DropReason
	HasReason bool
	Verdict   Verdict
}

// ErrMonitorClosed is returned by MonitorReader.Read once the reader is closed.
var ErrMonitorClosed = monring.ErrClosed

// MonitorReader reads the events of the monitor's ring buffer.
type MonitorReader struct{ *monring.Reader }

// MonitorReader opens the monitor's ring buffer. One reader at a time: events are
// consumed by whoever reads them.
func (d *Datapath) MonitorReader() (*MonitorReader, error) {
	r, err := monring.NewReader(d.objs.LbdMonRing)
	if err != nil {
		return nil, err
	}
	return &MonitorReader{r}, nil
}

// errNotXDP is returned for a record another hook wrote: the ring is this program's,
// so it means the layouts disagree.
var errNotXDP = errors.New("monitor event of another hook in lbxdp's ring")

// Read waits for the next event; it returns ErrMonitorClosed once Close was called.
func (r *MonitorReader) Read() (MonitorEvent, error) {
	raw, err := r.Reader.Read()
	if err != nil {
		return MonitorEvent{}, err
	}
	if raw.Hook != uint8(lbxdpLbdMonHookLBD_MON_HOOK_XDP) {
		return MonitorEvent{}, errNotXDP
	}
	e := MonitorEvent{Time: raw.Time, Ifindex: raw.Ifindex, Len: raw.Len, Data: raw.Data, Verdict: Verdict(raw.Verdict)}
	if raw.Reason != reasonNone {
		e.Reason, e.HasReason = DropReason(raw.Reason), true
	}
	return e, nil
}
