//go:build linux

package lbxdp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf/ringbuf"
)

// MonitorSnapLen is how many bytes of a packet a monitor event carries at most:
// LB_MON_SNAPLEN, which TestConstantsAsCompiled compares it with.
const MonitorSnapLen = 128

// Monitor flags: enum lb_mon_flag, as bpf2go generates it.
const (
	monReasons   = uint32(lbxdpLbMonFlagLB_MON_REASONS)
	monForwarded = uint32(lbxdpLbMonFlagLB_MON_FORWARDED)
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
	var v lbxdpLbMonConfig
	if c.Reasons {
		v.Flags |= monReasons
	}
	if c.Forwarded {
		v.Flags |= monForwarded
	}
	v.Sample, v.Rate = c.Sample, c.Rate
	if err := d.objs.LbMon.Set(v); err != nil {
		return fmt.Errorf("set monitor config: %w", err)
	}
	return nil
}

// MonitorCounters are the monitor's per-CPU counters, summed: events sent, and the
// qualifying packets that were not reported because the sampler skipped them, the
// rate limit held them back or the ring buffer was full (a reader too slow).
type MonitorCounters struct {
	Sent, SampledOut, RateLimited, RingFull uint64
}

// MonitorCounters reads the monitor's counters.
func (d *Datapath) MonitorCounters() (MonitorCounters, error) {
	var per []lbxdpLbMonState
	if err := d.objs.LbMonCpu.Lookup(uint32(0), &per); err != nil {
		return MonitorCounters{}, fmt.Errorf("read monitor counters: %w", err)
	}
	var c MonitorCounters
	for _, p := range per {
		c.Sent += p.Sent
		c.SampledOut += p.SampledOut
		c.RateLimited += p.RateLimited
		c.RingFull += p.RingFull
	}
	return c, nil
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

// monEventHeader is the head of struct lb_mon_event, before its data (checked
// against lbxdpLbMonEvent by TestConstantsAsCompiled).
const monEventHeader = 24

// ErrMonitorClosed is returned by MonitorReader.Read once the reader is closed.
var ErrMonitorClosed = errors.New("monitor reader closed")

// MonitorReader reads the events of the monitor's ring buffer.
type MonitorReader struct {
	rd  *ringbuf.Reader
	rec ringbuf.Record
}

// MonitorReader opens the monitor's ring buffer. One reader at a time: events are
// consumed by whoever reads them.
func (d *Datapath) MonitorReader() (*MonitorReader, error) {
	rd, err := ringbuf.NewReader(d.objs.LbMonRing)
	if err != nil {
		return nil, fmt.Errorf("open monitor ring buffer: %w", err)
	}
	return &MonitorReader{rd: rd}, nil
}

// Read waits for the next event; it returns ErrMonitorClosed once Close was called.
func (r *MonitorReader) Read() (MonitorEvent, error) {
	if err := r.rd.ReadInto(&r.rec); err != nil {
		if errors.Is(err, ringbuf.ErrClosed) {
			return MonitorEvent{}, ErrMonitorClosed
		}
		return MonitorEvent{}, fmt.Errorf("read monitor event: %w", err)
	}
	return ParseMonitorEvent(r.rec.RawSample)
}

// Close ends the reader; a blocked Read returns.
func (r *MonitorReader) Close() error { return r.rd.Close() }

// ParseMonitorEvent decodes one record of the ring buffer (struct lb_mon_event).
func ParseMonitorEvent(b []byte) (MonitorEvent, error) {
	if len(b) < monEventHeader {
		return MonitorEvent{}, fmt.Errorf("monitor event of %d bytes: want at least %d", len(b), monEventHeader)
	}
	e := MonitorEvent{
		Time:    time.Duration(binary.NativeEndian.Uint64(b[0:])),
		Ifindex: int(binary.NativeEndian.Uint32(b[8:])),
		Len:     int(binary.NativeEndian.Uint32(b[12:])),
		Verdict: Verdict(b[19]),
	}
	capLen := int(binary.NativeEndian.Uint16(b[16:]))
	if capLen > MonitorSnapLen || monEventHeader+capLen > len(b) {
		return MonitorEvent{}, fmt.Errorf("monitor event: %d captured bytes in a record of %d", capLen, len(b))
	}
	e.Data = append([]byte(nil), b[monEventHeader:monEventHeader+capLen]...)
	if b[18] != reasonNone {
		e.Reason, e.HasReason = DropReason(b[18]), true
	}
	return e, nil
}

// SetDeadline makes a blocked Read return os.ErrDeadlineExceeded at t; the zero time
// waits for ever.
func (r *MonitorReader) SetDeadline(t time.Time) { r.rd.SetDeadline(t) }
