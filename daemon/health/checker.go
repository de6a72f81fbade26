package health

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// ErrStopped is returned by Set after Stop.
var ErrStopped = errors.New("health checker stopped")

// DefaultMaxInFlight bounds concurrent probes when Options.MaxInFlight is 0.
// It bounds open sockets, not CPU: 1,000 targets at 1 s whose probes all hang
// for a 1 s timeout need 1,000 slots to keep their cadence.
const DefaultMaxInFlight = 1024

// Transition is one change of a target's state.
type Transition struct {
	Key      string
	From, To State
	Reason   string
	At       time.Time
	// Status is the target's status right after the change.
	Status Status
}

// Options configure a Checker. The zero value works.
type Options struct {
	// Logger receives one line per transition (nil: no logging).
	Logger hclog.Logger
	// Notify receives every transition, in order, from a single goroutine:
	// it may block, which only delays later notifications, never probes. It
	// must not call Stop.
	Notify func(Transition)
	// MaxInFlight bounds concurrent probes (default DefaultMaxInFlight).
	MaxInFlight int
	// RootCAs verifies HTTPS backends (nil: the system roots).
	RootCAs *x509.CertPool
	// Damping configures flap damping (zero value: defaults).
	Damping Damping
}

// Checker probes a set of targets concurrently and tracks their health.
//
// Each probed target has one goroutine that sleeps on a timer between probes:
// at 1,000 targets this is about 1,000 parked goroutines and timers, which cost
// nothing while idle, so CPU is spent only on the probes themselves. A
// semaphore bounds how many probes run at once.
type Checker struct {
	log     hclog.Logger
	notify  func(Transition)
	roots   *x509.CertPool
	damping Damping
	sem     chan struct{}
	wg      sync.WaitGroup

	mu       sync.Mutex
	targets  map[string]*target
	stopped  bool
	queue    []Transition
	wake     *sync.Cond
	dispDone chan struct{}
}

type target struct {
	t   Target
	m   machine
	run *runner // nil for KindNone
}

// runner is one goroutine probing one target with one spec. A spec change
// replaces the runner; results of a replaced runner are dropped.
type runner struct {
	t      Target
	p      prober
	cancel context.CancelFunc
}

// New returns a running Checker with no targets. Call Stop to release it.
func New(o Options) *Checker {
	c := &Checker{
		log:      o.Logger,
		notify:   o.Notify,
		roots:    o.RootCAs,
		damping:  o.Damping.withDefaults(),
		targets:  make(map[string]*target),
		dispDone: make(chan struct{}),
	}
	if c.log == nil {
		c.log = hclog.NewNullLogger()
	}
	n := o.MaxInFlight
	if n <= 0 {
		n = DefaultMaxInFlight
	}
	c.sem = make(chan struct{}, n)
	c.wake = sync.NewCond(&c.mu)
	go c.dispatch()
	return c
}

// Set replaces the target set atomically: on error nothing changes. Targets
// whose key is kept keep their state; a kept target whose probe changed keeps
// its state but must earn Rise or Fall again with the new probe. Targets that
// switch to KindNone become UP. New targets start as their Spec.Initial says
// and are probed first at a random point within one interval, so that adding
// many at once causes no burst.
func (c *Checker) Set(targets []Target) error {
	next := make(map[string]Target, len(targets))
	probers := make(map[string]prober, len(targets))
	for _, t := range targets {
		t.Spec = t.Spec.WithDefaults()
		if err := t.validate(); err != nil {
			return fmt.Errorf("set health targets: %w", err)
		}
		if _, dup := next[t.Key]; dup {
			return fmt.Errorf("set health targets: duplicate key %q", t.Key)
		}
		next[t.Key] = t
		if t.Spec.Kind != KindNone {
			p, err := newProber(t, c.roots)
			if err != nil {
				return fmt.Errorf("set health targets: target %q: %w", t.Key, err)
			}
			probers[t.Key] = p
		}
	}

	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return ErrStopped
	}
	var added, removed, changed int
	for key, tg := range c.targets {
		if _, keep := next[key]; !keep {
			tg.stop()
			delete(c.targets, key)
			removed++
		}
	}
	for key, t := range next {
		tg, ok := c.targets[key]
		switch {
		case !ok:
			tg = &target{t: t, m: newMachine(t.Spec, now)}
			c.targets[key] = tg
			added++
		case tg.t == t:
			continue
		default:
			tg.stop()
			if !tg.t.Spec.sameProbe(t.Spec) || tg.t.Addr != t.Addr {
				tg.m.reprobe()
			}
			if t.Spec.Kind == KindNone {
				if tg.m.state != Up {
					c.enqueue(key, tg.m.move(Up, "health check disabled", now), &tg.m, now)
				}
				tg.m.reason = "health check disabled"
			}
			tg.t = t
			changed++
		}
		if p := probers[key]; p != nil {
			c.start(tg, p)
		}
	}
	c.log.Debug("health targets set", "op", "health-set", "targets", len(c.targets),
		"added", added, "removed", removed, "changed", changed)
	return nil
}

func (tg *target) stop() {
	if tg.run != nil {
		tg.run.cancel()
		tg.run = nil
	}
}

// start launches a runner probing tg with p. Called with c.mu held.
func (c *Checker) start(tg *target, p prober) {
	ctx, cancel := context.WithCancel(context.Background())
	r := &runner{t: tg.t, p: p, cancel: cancel}
	tg.run = r
	c.wg.Add(1)
	go c.loop(ctx, r)
}

// firstDelay spreads the first probes of new targets uniformly over one
// interval.
func firstDelay(interval time.Duration) time.Duration {
	return rand.N(interval)
}

// nextGap is the time to the next probe: the interval ±10%, so targets added
// together drift apart instead of probing in lockstep.
func nextGap(interval time.Duration) time.Duration {
	return interval - interval/10 + rand.N(interval/5+1)
}

// maxGrid is the coarsest grid probe start times are rounded up to.
const maxGrid = 25 * time.Millisecond

// onGrid rounds a probe time up to a grid of min(maxGrid, interval/10). The
// runtime then wakes once for the few probes that share a grid point instead
// of once per probe: at 1,000 targets and 1 s this measured about half the
// CPU per probe of ungridded timers. A backend still sees one probe per
// interval (the rounding is within the jitter), and 25 ms worth of probes
// to different backends is no burst.
func onGrid(t time.Time, interval time.Duration) time.Time {
	g := min(maxGrid, interval/10)
	return t.Add(g - 1).Truncate(g)
}

func (c *Checker) loop(ctx context.Context, r *runner) {
	defer c.wg.Done()
	interval := r.t.Spec.Interval
	due := time.Now().Add(firstDelay(interval))
	timer := time.NewTimer(time.Until(onGrid(due, interval)))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		select {
		case c.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		res := runProbe(ctx, r.p, r.t.Spec.Timeout)
		<-c.sem
		c.record(r, res)

		// Keep the cadence independent of probe latency; if the probe ran
		// late (a full semaphore), start afresh from now rather than firing
		// back to back.
		due = due.Add(nextGap(interval))
		if now := time.Now(); due.Before(now) {
			due = now.Add(firstDelay(interval / 10))
		}
		timer.Reset(time.Until(onGrid(due, interval)))
	}
}

// record applies a probe result, unless its runner was replaced meanwhile.
func (c *Checker) record(r *runner, res Result) {
	now := time.Now()
	c.mu.Lock()
	tg, ok := c.targets[r.t.Key]
	if !ok || tg.run != r || c.stopped {
		c.mu.Unlock()
		return
	}
	ch, held := tg.m.observe(res, r.t.Spec, c.damping, now)
	if ch != nil {
		c.enqueue(r.t.Key, ch, &tg.m, now)
	}
	var heldUntil time.Time
	var penalty float64
	if held {
		heldUntil, penalty = tg.m.heldUntil, tg.m.penaltyNow(c.damping, now)
	}
	c.mu.Unlock()
	if held {
		c.log.Info("backend return held by flap damping", "op", "health", "target", r.t.Key,
			"until", heldUntil, "penalty", fmt.Sprintf("%.2f", penalty))
	}
}

// enqueue queues a transition for logging and delivery. Called with c.mu
// held, so transitions keep the order in which they happened.
func (c *Checker) enqueue(key string, ch *change, m *machine, now time.Time) {
	c.queue = append(c.queue, Transition{
		Key: key, From: ch.from, To: ch.to, Reason: ch.reason, At: now,
		Status: m.status(key, c.damping, now),
	})
	c.wake.Signal()
}

// dispatch logs and delivers transitions from a queue, so a slow consumer
// never stalls probing. The queue is short in practice: a target makes at
// most one transition per probe and damping slows repeated ones.
func (c *Checker) dispatch() {
	defer close(c.dispDone)
	c.mu.Lock()
	for {
		for len(c.queue) == 0 && !c.stopped {
			c.wake.Wait()
		}
		if len(c.queue) == 0 {
			c.mu.Unlock()
			return
		}
		batch := c.queue
		c.queue = nil
		c.mu.Unlock()
		for _, tr := range batch {
			c.log.Info("backend health changed", "op", "health", "target", tr.Key,
				"from", tr.From.String(), "to", tr.To.String(), "reason", tr.Reason)
			if c.notify != nil {
				c.notify(tr)
			}
		}
		c.mu.Lock()
	}
}

// Status returns the health of the target with the given key.
func (c *Checker) Status(key string) (Status, bool) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	tg, ok := c.targets[key]
	if !ok {
		return Status{}, false
	}
	return tg.m.status(key, c.damping, now), true
}

// Statuses returns the health of every target, sorted by key.
func (c *Checker) Statuses() []Status {
	now := time.Now()
	c.mu.Lock()
	out := make([]Status, 0, len(c.targets))
	for key, tg := range c.targets {
		out = append(out, tg.m.status(key, c.damping, now))
	}
	c.mu.Unlock()
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// Stop ends all probes, delivers the transitions already queued (so it waits
// for Notify to return) and returns when every goroutine of the Checker has
// exited. Later calls do nothing.
func (c *Checker) Stop() {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		<-c.dispDone
		return
	}
	c.stopped = true
	for _, tg := range c.targets {
		tg.stop()
	}
	c.wake.Signal()
	c.mu.Unlock()
	c.wg.Wait()
	<-c.dispDone
}
