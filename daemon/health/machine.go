package health

import (
	"fmt"
	"math"
	"time"
)

// State is the health of a target.
type State uint8

const (
	// Unknown: not judged yet. Counts as usable (see InitialUnknown).
	Unknown State = iota
	// Up: passing its probes.
	Up
	// Down: failing its probes, or not yet back after failing.
	Down
)

func (s State) String() string {
	switch s {
	case Unknown:
		return "unknown"
	case Up:
		return "up"
	case Down:
		return "down"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Damping configures flap damping, which delays the return of a backend that
// keeps going down and up so that it stops churning Maglev tables (each change
// moves flows and costs every LB node a table rebuild).
//
// The rule: every UP→DOWN transition adds 1 to the target's penalty, and the
// penalty halves every HalfLife. When a DOWN target reaches Rise consecutive
// successes while its penalty is above 1, it stays DOWN until the penalty has
// decayed to 1, that is for HalfLife×log2(penalty), and only then returns if
// its probes still pass. So a single failure and recovery is never delayed; a
// second flap shortly after the first holds re-entry for up to one HalfLife,
// a third for about 1.6 HalfLife, and so on. The penalty is capped so that no
// hold exceeds MaxHold, which also bounds how long a past flapping episode is
// remembered.
type Damping struct {
	// HalfLife is the penalty's half-life (default 60 s). Negative disables
	// damping.
	HalfLife time.Duration
	// MaxHold bounds any hold (default 10 min).
	MaxHold time.Duration
}

// Damping defaults.
const (
	DefaultHalfLife = time.Minute
	DefaultMaxHold  = 10 * time.Minute
)

func (d Damping) withDefaults() Damping {
	if d.HalfLife == 0 {
		d.HalfLife = DefaultHalfLife
	}
	if d.MaxHold <= 0 {
		d.MaxHold = DefaultMaxHold
	}
	return d
}

func (d Damping) enabled() bool { return d.HalfLife > 0 }

// decay returns penalty p after dt has passed.
func (d Damping) decay(p float64, dt time.Duration) float64 {
	if !d.enabled() || p == 0 {
		return 0
	}
	return p * math.Exp2(-dt.Seconds()/d.HalfLife.Seconds())
}

// ceiling is the penalty whose hold is exactly MaxHold.
func (d Damping) ceiling() float64 {
	return math.Exp2(d.MaxHold.Seconds() / d.HalfLife.Seconds())
}

// hold is how long re-entry waits under penalty p.
func (d Damping) hold(p float64) time.Duration {
	if !d.enabled() || p <= 1 {
		return 0
	}
	h := time.Duration(math.Log2(p) * float64(d.HalfLife))
	return min(h, d.MaxHold)
}

// machine is the health state of one target. It is pure: time comes in as an
// argument, so the rules are tested without clocks.
type machine struct {
	state     State
	reason    string
	since     time.Time
	okRun     int
	failRun   int
	checks    uint64
	last      Result
	penalty   float64
	penaltyAt time.Time
	heldUntil time.Time
}

// change is a state transition made by the machine.
type change struct {
	from, to State
	reason   string
}

func newMachine(s Spec, now time.Time) machine {
	m := machine{since: now}
	switch {
	case s.Kind == KindNone:
		m.state, m.reason = Up, "health check disabled"
	case s.Initial == InitialDown:
		m.state, m.reason = Down, fmt.Sprintf("new target: waiting for %d successful probes", s.Rise)
	default:
		m.state, m.reason = Unknown, "new target: not probed yet"
	}
	return m
}

func (m *machine) move(to State, reason string, now time.Time) *change {
	c := &change{from: m.state, to: to, reason: reason}
	m.state, m.reason, m.since = to, reason, now
	return c
}

// penaltyNow returns the penalty decayed to now.
func (m *machine) penaltyNow(d Damping, now time.Time) float64 {
	return d.decay(m.penalty, now.Sub(m.penaltyAt))
}

// observe applies one probe result. It returns the transition it caused, if
// any, and whether the result started a damping hold (worth one log line).
func (m *machine) observe(r Result, s Spec, d Damping, now time.Time) (c *change, holdStarted bool) {
	m.checks++
	m.last = r
	if !r.OK {
		m.okRun = 0
		m.failRun++
		m.heldUntil = time.Time{}
		if m.state == Down || m.failRun < s.Fall {
			return nil, false
		}
		if m.state == Up && d.enabled() {
			m.penalty = min(m.penaltyNow(d, now)+1, d.ceiling())
			m.penaltyAt = now
		}
		return m.move(Down, fmt.Sprintf("%d consecutive failed probes: %s", m.failRun, r.Err), now), false
	}
	m.failRun = 0
	m.okRun++
	switch m.state {
	case Unknown:
		return m.move(Up, "first probe passed", now), false
	case Down:
		if m.okRun < s.Rise {
			return nil, false
		}
		if h := d.hold(m.penaltyNow(d, now)); h > 0 {
			holdStarted = m.heldUntil.IsZero()
			if holdStarted {
				m.heldUntil = now.Add(h)
				m.reason = fmt.Sprintf("probes pass; return held by flap damping until %s",
					m.heldUntil.UTC().Format(time.RFC3339))
			}
			return nil, holdStarted
		}
		m.heldUntil = time.Time{}
		return m.move(Up, fmt.Sprintf("%d consecutive successful probes", m.okRun), now), false
	}
	return nil, false
}

// reprobe resets what the machine learnt from an old probe when the probe
// itself changes. The state is kept so an edit never takes a serving backend
// out; the new probe has to earn Rise or Fall on its own.
func (m *machine) reprobe() {
	m.okRun, m.failRun = 0, 0
	m.heldUntil = time.Time{}
}

// Status is a snapshot of one target's health.
type Status struct {
	Key   string
	State State
	// Reason explains the current state in words, for the API and lbctl.
	Reason string
	// LastTransition is when State last changed (or when the target was
	// added).
	LastTransition time.Time
	// Last is the most recent probe result (zero before the first probe).
	Last Result
	// ConsecutiveOK and ConsecutiveFailed count the current run of results.
	ConsecutiveOK, ConsecutiveFailed int
	// Checks counts probes since the target was added.
	Checks uint64
	// Penalty is the flap-damping penalty now; above 1 re-entry is held.
	Penalty float64
	// HeldUntil is set while a DOWN target's return is held by damping.
	HeldUntil time.Time
}

// Usable reports whether the target may receive new flows: UP or not yet
// judged.
func (s Status) Usable() bool { return s.State != Down }

func (m *machine) status(key string, d Damping, now time.Time) Status {
	return Status{
		Key:               key,
		State:             m.state,
		Reason:            m.reason,
		LastTransition:    m.since,
		Last:              m.last,
		ConsecutiveOK:     m.okRun,
		ConsecutiveFailed: m.failRun,
		Checks:            m.checks,
		Penalty:           m.penaltyNow(d, now),
		HeldUntil:         m.heldUntil,
	}
}
