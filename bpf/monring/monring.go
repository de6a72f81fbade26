//go:build linux

// Package monring is the Go side of the packet monitor that lbxdp and backendtc share
// (bpf/include/lbd_monitor.h): the switch and limits written to a program's lbd_mon
// variable, its per-CPU counters, and the reader of its ring buffer. What a record's
// reason, verdict and hook mean is the program's: lbxdp and backendtc name them.
package monring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
)

// SnapLen is how many bytes of a packet an event carries at most: LBD_MON_SNAPLEN,
// which each program's tests compare it with.
const SnapLen = 128

// EventHeader is the head of struct lbd_mon_event, before its data (each program's
// tests compare it with the generated layout).
const EventHeader = 24

// Config is struct lbd_mon_config, the program's lbd_mon variable: Flags 0 is off.
type Config struct {
	Flags, Sample, Rate, Pad uint32
}

// Set writes c to the program's lbd_mon variable; it applies from the next packet.
func Set(v *ebpf.Variable, c Config) error {
	if err := v.Set(c); err != nil {
		return fmt.Errorf("set monitor config: %w", err)
	}
	return nil
}

// State is struct lbd_mon_state, the value of a program's lbd_mon_cpu map.
type State struct {
	RefillNS    uint64
	Tokens      uint32
	Skipped     uint32
	Sent        uint64
	SampledOut  uint64
	RateLimited uint64
	RingFull    uint64
}

// Counters are the monitor's per-CPU counters, summed: events sent, and the
// qualifying packets that were not reported because the sampler skipped them, the
// rate limit held them back or the ring buffer was full (a reader too slow).
type Counters struct {
	Sent, SampledOut, RateLimited, RingFull uint64
}

// ReadCounters sums a program's lbd_mon_cpu map.
func ReadCounters(m *ebpf.Map) (Counters, error) {
	var per []State
	if err := m.Lookup(uint32(0), &per); err != nil {
		return Counters{}, fmt.Errorf("read monitor counters: %w", err)
	}
	var c Counters
	for _, p := range per {
		c = c.Add(Counters{Sent: p.Sent, SampledOut: p.SampledOut, RateLimited: p.RateLimited, RingFull: p.RingFull})
	}
	return c, nil
}

// Add is the sum of two sets of counters (two CPUs, two programs).
func (c Counters) Add(o Counters) Counters {
	return Counters{Sent: c.Sent + o.Sent, SampledOut: c.SampledOut + o.SampledOut,
		RateLimited: c.RateLimited + o.RateLimited, RingFull: c.RingFull + o.RingFull}
}

// Event is one record of the ring buffer, as the program wrote it.
type Event struct {
	// Time is when the program handled the packet, on CLOCK_MONOTONIC.
	Time time.Duration
	// Ifindex is the interface of the hook that reported it.
	Ifindex int
	// Len is the frame's length; Data holds its first bytes (at most SnapLen) as the
	// program left it.
	Len  int
	Data []byte
	// Reason, Verdict and Hook as the program wrote them (enum lbd_mon_hook says
	// which program's reasons and verdicts they are).
	Reason, Verdict, Hook uint8
}

// Parse decodes one record of the ring buffer (struct lbd_mon_event).
func Parse(b []byte) (Event, error) {
	if len(b) < EventHeader {
		return Event{}, fmt.Errorf("monitor event of %d bytes: want at least %d", len(b), EventHeader)
	}
	e := Event{
		Time:    time.Duration(binary.NativeEndian.Uint64(b[0:])),
		Ifindex: int(binary.NativeEndian.Uint32(b[8:])),
		Len:     int(binary.NativeEndian.Uint32(b[12:])),
		Reason:  b[18],
		Verdict: b[19],
		Hook:    b[20],
	}
	capLen := int(binary.NativeEndian.Uint16(b[16:]))
	if capLen > SnapLen || EventHeader+capLen > len(b) {
		return Event{}, fmt.Errorf("monitor event: %d captured bytes in a record of %d", capLen, len(b))
	}
	e.Data = append([]byte(nil), b[EventHeader:EventHeader+capLen]...)
	return e, nil
}

// ErrClosed is returned by Reader.Read once the reader is closed.
var ErrClosed = errors.New("monitor reader closed")

// Reader reads the events of a program's ring buffer.
type Reader struct {
	rd  *ringbuf.Reader
	rec ringbuf.Record
}

// NewReader opens a program's lbd_mon_ring. One reader at a time: events are consumed
// by whoever reads them.
func NewReader(ring *ebpf.Map) (*Reader, error) {
	rd, err := ringbuf.NewReader(ring)
	if err != nil {
		return nil, fmt.Errorf("open monitor ring buffer: %w", err)
	}
	return &Reader{rd: rd}, nil
}

// Read waits for the next event; it returns ErrClosed once Close was called.
func (r *Reader) Read() (Event, error) {
	if err := r.rd.ReadInto(&r.rec); err != nil {
		if errors.Is(err, ringbuf.ErrClosed) {
			return Event{}, ErrClosed
		}
		return Event{}, fmt.Errorf("read monitor event: %w", err)
	}
	return Parse(r.rec.RawSample)
}

// Close ends the reader; a blocked Read returns.
func (r *Reader) Close() error { return r.rd.Close() }

// SetDeadline makes a blocked Read return os.ErrDeadlineExceeded at t; the zero time
// waits for ever.
func (r *Reader) SetDeadline(t time.Time) { r.rd.SetDeadline(t) }
