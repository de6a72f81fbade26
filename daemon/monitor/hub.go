// Package monitor hands the packets the datapath reports (on an LB node drops, answers,
// passes and, when asked, forwarded packets; on a backend node drops) to the listeners
// of `lbctl monitor`. The kernel
// side reports nothing while no one listens: the hub turns it on with the first listener
// and off with the last. One goroutine reads the datapath's ring buffer and offers each
// event to every listener whose filter takes it; a listener that does not keep up loses
// events, counted, and never slows the reader or the others.
package monitor

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/servicematch"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// Source is the datapath's side of the monitor.
type Source interface {
	// SetMonitor sets what the datapath reports: nothing (on false), the packets that
	// hit a reason, and with forwarded the balanced ones too.
	SetMonitor(on, forwarded bool) error
	// OpenMonitor opens the stream of reported packets. One is open at a time.
	OpenMonitor() (Reader, error)
}

// Reader reads reported packets, decoded. Close makes a blocked Read return ErrClosed.
type Reader interface {
	Read() (*lbdv1.MonitorEvent, error)
	Close() error
}

// ErrClosed is what Reader.Read returns once the reader is closed.
var ErrClosed = errors.New("monitor closed")

// Forwarded is the reason of a balanced packet's event.
const Forwarded = "forwarded"

// Defaults of Options.
const (
	DefaultMaxListeners = 16
	DefaultBacklog      = 1024
)

// Options configure a Hub.
type Options struct {
	// MaxListeners bounds the listeners at once (DefaultMaxListeners if 0).
	MaxListeners int
	// Backlog is how many events a listener may have waiting before it loses the next
	// ones (DefaultBacklog if 0).
	Backlog int
	// Reasons are the datapath's reason names, which a filter may name besides Forwarded.
	Reasons []string
	Logger  hclog.Logger
}

// Hub fans the datapath's events out to listeners.
type Hub struct {
	src  Source
	opts Options
	log  hclog.Logger

	// life serializes turning the datapath's monitor on and off; the reader loop never
	// takes it, so stopping can wait for the loop.
	life sync.Mutex
	mu   sync.Mutex
	subs []*Listener
	// Set while the monitor is on.
	reader  Reader
	done    chan struct{}
	started time.Time
	fwd     bool
}

// New returns a hub over a datapath's monitor.
func New(src Source, opts Options) *Hub {
	if opts.MaxListeners <= 0 {
		opts.MaxListeners = DefaultMaxListeners
	}
	if opts.Backlog <= 0 {
		opts.Backlog = DefaultBacklog
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	return &Hub{src: src, opts: opts, log: opts.Logger}
}

// Reasons returns the reason names a filter may select, besides Forwarded.
func (h *Hub) Reasons() []string { return h.opts.Reasons }

// Filter selects the events a listener gets.
type Filter struct {
	// Reasons, if any, are the only ones it gets (Forwarded among them for balanced packets).
	Reasons []string
	// Services, if not empty, selects events by the service they are for.
	Services servicematch.Set
	// DropsOnly leaves out everything but packets the datapath dropped (XDP_DROP, or
	// TCX_DROP on a backend node).
	DropsOnly bool
	// Forwarded asks for balanced packets too.
	Forwarded bool
}

func (f *Filter) match(ev *lbdv1.MonitorEvent) bool {
	if ev.Reason == Forwarded && !f.Forwarded {
		return false
	}
	if len(f.Reasons) > 0 && !slices.Contains(f.Reasons, ev.Reason) {
		return false
	}
	if f.DropsOnly && ev.Verdict != "XDP_DROP" && ev.Verdict != "TCX_DROP" {
		return false
	}
	return f.Services.Empty() || (ev.ServiceName != "" && f.Services.Match(ev.ServiceName))
}

// Item is one event for a listener, with the events it lost before it.
type Item struct {
	Event *lbdv1.MonitorEvent
	Lost  uint64
}

// Listener receives the events its filter takes.
type Listener struct {
	hub    *Hub
	filter Filter
	ch     chan Item
	// lost counts the events dropped since the last one queued; under hub.mu.
	lost uint64
}

// Events is the listener's queue; it is closed when the listener is.
func (l *Listener) Events() <-chan Item { return l.ch }

// ErrTooMany is returned by Listen when MaxListeners listen already.
var ErrTooMany = errors.New("too many monitor listeners")

// Listen adds a listener; the first one turns the datapath's monitor on. Close it when
// done: the last one turns the monitor off.
func (h *Hub) Listen(f Filter) (*Listener, error) {
	h.life.Lock()
	defer h.life.Unlock()
	l := &Listener{hub: h, filter: f, ch: make(chan Item, h.opts.Backlog)}
	h.mu.Lock()
	if len(h.subs) >= h.opts.MaxListeners {
		h.mu.Unlock()
		return nil, fmt.Errorf("%w: %d are open", ErrTooMany, len(h.subs))
	}
	h.subs = append(h.subs, l)
	h.mu.Unlock()
	if err := h.apply(); err != nil {
		h.remove(l)
		// Leave the datapath as the remaining listeners want it.
		if err2 := h.apply(); err2 != nil {
			h.log.Error("monitor: could not restore the datapath's monitor", "op", "listen", "error", err2)
		}
		return nil, err
	}
	return l, nil
}

// Close removes the listener and closes its queue.
func (l *Listener) Close() {
	h := l.hub
	h.life.Lock()
	defer h.life.Unlock()
	if !h.remove(l) {
		return
	}
	if err := h.apply(); err != nil {
		h.log.Error("monitor: could not change the datapath's monitor", "op", "close", "error", err)
	}
}

// remove takes l out of the listeners and closes its queue; false if it was out already.
func (h *Hub) remove(l *Listener) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	i := slices.Index(h.subs, l)
	if i < 0 {
		return false
	}
	h.subs = slices.Delete(h.subs, i, i+1)
	close(l.ch)
	return true
}

// apply brings the datapath's monitor to what the listeners need: off without any, on
// (with forwarded packets if one asks for them) otherwise. Called with life held.
func (h *Hub) apply() error {
	h.mu.Lock()
	n := len(h.subs)
	fwd := slices.ContainsFunc(h.subs, func(l *Listener) bool { return l.filter.Forwarded })
	h.mu.Unlock()
	switch {
	case n == 0 && h.reader != nil:
		err := h.src.SetMonitor(false, false)
		h.reader.Close()
		<-h.done
		h.reader, h.done = nil, nil
		if err != nil {
			return fmt.Errorf("turn the datapath's monitor off: %w", err)
		}
		h.log.Info("monitor off", "op", "monitor")
	case n > 0 && h.reader == nil:
		r, err := h.src.OpenMonitor()
		if err != nil {
			return fmt.Errorf("open the datapath's monitor: %w", err)
		}
		// Events still in the ring from an earlier session are older than this.
		h.started = time.Now()
		if err := h.src.SetMonitor(true, fwd); err != nil {
			r.Close()
			return fmt.Errorf("turn the datapath's monitor on: %w", err)
		}
		h.reader, h.done, h.fwd = r, make(chan struct{}), fwd
		go h.loop(r, h.started, h.done)
		h.log.Info("monitor on", "op", "monitor", "forwarded", fwd)
	case n > 0 && fwd != h.fwd:
		if err := h.src.SetMonitor(true, fwd); err != nil {
			return fmt.Errorf("change the datapath's monitor: %w", err)
		}
		h.fwd = fwd
	}
	return nil
}

// loop reads the datapath's events until the reader is closed.
func (h *Hub) loop(r Reader, started time.Time, done chan struct{}) {
	defer close(done)
	for {
		ev, err := r.Read()
		if errors.Is(err, ErrClosed) {
			return
		}
		if err != nil {
			h.log.Warn("monitor: an event could not be read", "op", "monitor", "error", err)
			continue
		}
		if ev.GetTime().AsTime().Before(started) {
			continue
		}
		h.offer(ev)
	}
}

// offer queues ev for every listener that takes it, never waiting for one.
func (h *Hub) offer(ev *lbdv1.MonitorEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, l := range h.subs {
		if !l.filter.match(ev) {
			continue
		}
		select {
		case l.ch <- Item{Event: ev, Lost: l.lost}:
			l.lost = 0
		default:
			l.lost++
		}
	}
}
