//go:build linux

package backendtc

import (
	"errors"
	"fmt"
	"time"

	"github.com/lbd-dev/lbd/bpf/monring"
)

// MonitorConfig says which packets the programs report to the monitor's ring buffer
// (bpf/include/lbd_monitor.h): the drops, from CounterDropNotAllowed on. The zero
// value turns the monitor off: a packet then pays nothing for it, and a drop one load
// and one branch.
type MonitorConfig struct {
	// Drops reports dropped packets.
	Drops bool
	// Sample reports one in Sample of the packets that qualify; 0 and 1 report each.
	Sample uint32
	// Rate bounds the events a second each CPU sends, in bursts of up to Rate.
	Rate uint32
}

// SetMonitor writes the monitor's configuration; it applies from the next packet.
func (d *Datapath) SetMonitor(c MonitorConfig) error {
	v := monring.Config{Sample: c.Sample, Rate: c.Rate}
	if c.Drops {
		v.Flags = uint32(backendtcLbdMonFlagLBD_MON_REASONS)
	}
	return monring.Set(d.objs.LbdMon, v)
}

// MonitorCounters reads the monitor's counters, summed over CPUs.
func (d *Datapath) MonitorCounters() (monring.Counters, error) {
	return monring.ReadCounters(d.objs.LbdMonCpu)
}

// Hook is the program that reported a packet.
type Hook uint8

// Hooks: enum lbd_mon_hook, as bpf2go generates it.
const (
	HookIngress = Hook(backendtcLbdMonHookLBD_MON_HOOK_TC_INGRESS)
	HookEgress  = Hook(backendtcLbdMonHookLBD_MON_HOOK_TC_EGRESS)
)

// String names the hook as the monitor shows it (MonitorEvent.hook).
func (h Hook) String() string {
	switch h {
	case HookIngress:
		return "tc-ingress"
	case HookEgress:
		return "tc-egress"
	}
	return fmt.Sprintf("hook(%d)", uint8(h))
}

// MonitorEvent is one dropped packet a program reported.
type MonitorEvent struct {
	// Time is when the program dropped it, on CLOCK_MONOTONIC.
	Time time.Duration
	// Hook is the program that dropped it, and Ifindex the interface it is attached to.
	Hook    Hook
	Ifindex int
	// Len is the frame's length; Data holds its first bytes (at most
	// monring.SnapLen) as the program left it: an ingress packet as it arrived unless
	// it was dropped after its decapsulation (CounterDropNATFailed), an egress one as
	// the backend sent it.
	Len  int
	Data []byte
	// Reason is the drop counter it was counted in.
	Reason Counter
}

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

// errNotDrop is returned for a record that is not a drop of one of the two programs:
// the ring is theirs, so it means the layouts disagree.
var errNotDrop = errors.New("monitor event that is not a backendtc drop")

// Read waits for the next event; it returns monring.ErrClosed once Close was called.
func (r *MonitorReader) Read() (MonitorEvent, error) {
	raw, err := r.Reader.Read()
	if err != nil {
		return MonitorEvent{}, err
	}
	h := Hook(raw.Hook)
	if (h != HookIngress && h != HookEgress) || Counter(raw.Reason) >= numCounters {
		return MonitorEvent{}, fmt.Errorf("%w: hook %d, reason %d", errNotDrop, raw.Hook, raw.Reason)
	}
	return MonitorEvent{Time: raw.Time, Hook: h, Ifindex: raw.Ifindex, Len: raw.Len, Data: raw.Data, Reason: Counter(raw.Reason)}, nil
}
