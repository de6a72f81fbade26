package health

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

var (
	pass = Result{OK: true}
	fail = Result{Err: "connection refused"}
)

// feeder drives a machine with results at chosen times.
type feeder struct {
	t   *testing.T
	m   machine
	s   Spec
	d   Damping
	now time.Time
}

func newFeeder(t *testing.T, s Spec, d Damping) *feeder {
	s = s.WithDefaults()
	return &feeder{t: t, m: newMachine(s, t0), s: s, d: d, now: t0}
}

// step applies r at the current time plus dt and returns what observe did.
func (f *feeder) step(dt time.Duration, r Result) (*change, bool) {
	f.now = f.now.Add(dt)
	return f.m.observe(r, f.s, f.d, f.now)
}

// run applies results one second apart and checks the state after each.
func (f *feeder) run(results []Result, want []State) {
	f.t.Helper()
	for i, r := range results {
		f.step(time.Second, r)
		if f.m.state != want[i] {
			f.t.Fatalf("after result %d (ok=%v): state %v, want %v (reason %q)", i+1, r.OK, f.m.state, want[i], f.m.reason)
		}
	}
}

var noDamping = Damping{HalfLife: -1}

func TestRiseFall(t *testing.T) {
	f := newFeeder(t, Spec{Kind: KindTCP, Rise: 2, Fall: 3}, noDamping)
	if f.m.state != Unknown || !f.m.status("k", f.d, t0).Usable() {
		t.Fatalf("new target: state %v, want usable unknown", f.m.state)
	}
	f.run(
		[]Result{fail, fail, pass, fail, fail, pass, fail, fail, fail, pass, fail, pass, pass, pass},
		[]State{Unknown, Unknown, Up, Up, Up, Up, Up, Up, Down, Down, Down, Down, Up, Up},
	)
	st := f.m.status("k", f.d, f.now)
	if st.ConsecutiveOK != 3 || st.ConsecutiveFailed != 0 || st.Checks != 14 {
		t.Fatalf("counters: %+v", st)
	}
	if st.LastTransition != t0.Add(13*time.Second) {
		t.Fatalf("last transition %v, want the 13th result's time", st.LastTransition)
	}
}

func TestUnknownNeedsFallToGoDown(t *testing.T) {
	f := newFeeder(t, Spec{Kind: KindTCP, Rise: 2, Fall: 3}, Damping{}.withDefaults())
	f.run([]Result{fail, fail, fail}, []State{Unknown, Unknown, Down})
	if f.m.penalty != 0 {
		t.Fatalf("unknown→down counted as a flap: penalty %v", f.m.penalty)
	}
	if !strings.Contains(f.m.reason, "3 consecutive failed probes: connection refused") {
		t.Fatalf("reason %q", f.m.reason)
	}
	// Coming back needs rise, like any down target.
	f.run([]Result{pass, pass}, []State{Down, Up})
}

func TestInitialDownNeedsRise(t *testing.T) {
	f := newFeeder(t, Spec{Kind: KindHTTP, Rise: 3, Fall: 1, Initial: InitialDown}, noDamping)
	if f.m.status("k", f.d, t0).Usable() {
		t.Fatal("a target starting down is usable")
	}
	f.run([]Result{pass, pass, fail, pass, pass, pass, fail}, []State{Down, Down, Down, Down, Down, Up, Down})
}

func TestNoneIsUp(t *testing.T) {
	if m := newMachine(Spec{}, t0); m.state != Up {
		t.Fatalf("a target without health check is %v", m.state)
	}
}

func TestDampingMath(t *testing.T) {
	d := Damping{HalfLife: 10 * time.Second, MaxHold: time.Minute}
	if got := d.decay(4, 10*time.Second); math.Abs(got-2) > 1e-9 {
		t.Errorf("decay over one half-life: %v, want 2", got)
	}
	if got := d.decay(4, 20*time.Second); math.Abs(got-1) > 1e-9 {
		t.Errorf("decay over two half-lives: %v, want 1", got)
	}
	for p, want := range map[float64]time.Duration{0: 0, 1: 0, 2: 10 * time.Second, 4: 20 * time.Second, 1e9: time.Minute} {
		if got := d.hold(p); got != want {
			t.Errorf("hold(%v) = %v, want %v", p, got, want)
		}
	}
	if got := d.hold(d.ceiling()); got < time.Minute-time.Millisecond || got > time.Minute {
		t.Errorf("hold at the penalty ceiling %v, want MaxHold", got)
	}
	if off := (Damping{HalfLife: -1}); off.hold(100) != 0 || off.decay(100, 0) != 0 {
		t.Error("disabled damping still holds")
	}
}

func TestDampingHoldsRepeatedFlaps(t *testing.T) {
	d := Damping{HalfLife: 10 * time.Second, MaxHold: time.Minute}
	f := newFeeder(t, Spec{Kind: KindTCP, Rise: 2, Fall: 2}, d)
	f.run([]Result{pass}, []State{Up})

	// First flap: down and straight back, never delayed.
	f.run([]Result{fail, fail, pass, pass}, []State{Up, Down, Down, Up})
	if f.m.penalty != 1 {
		t.Fatalf("penalty after one flap: %v", f.m.penalty)
	}

	// Second flap soon after: its return is held.
	f.run([]Result{fail, fail, pass}, []State{Up, Down, Down})
	flapAt := f.now.Add(-time.Second)
	wantP := d.decay(1, flapAt.Sub(t0.Add(3*time.Second))) + 1
	if math.Abs(f.m.penalty-wantP) > 1e-9 {
		t.Fatalf("penalty after second flap: %v, want %v", f.m.penalty, wantP)
	}
	ch, started := f.step(time.Second, pass)
	if ch != nil || !started {
		t.Fatalf("rise reached under penalty: change %+v, hold started %v", ch, started)
	}
	wantUntil := f.now.Add(d.hold(f.m.penaltyNow(d, f.now)))
	st := f.m.status("k", d, f.now)
	if st.State != Down || !st.HeldUntil.Equal(wantUntil) || st.Penalty <= 1 || !strings.Contains(st.Reason, "flap damping") {
		t.Fatalf("held status: %+v, want held until %v", st, wantUntil)
	}
	if ch, started := f.step(time.Second, pass); ch != nil || started {
		t.Fatalf("hold logged twice or ended early: %+v %v", ch, started)
	}

	// A failure during the hold restarts the count: rise again, then the
	// remaining hold.
	f.step(time.Second, fail)
	if !f.m.heldUntil.IsZero() {
		t.Fatal("failure did not clear the hold")
	}
	f.step(time.Second, pass)
	if _, started := f.step(time.Second, pass); !started {
		t.Fatal("no new hold after a failure inside the old one")
	}

	// Once the penalty has decayed to 1, the next success brings it up.
	until := f.m.heldUntil
	ch, _ = f.step(until.Sub(f.now)+time.Millisecond, pass)
	if ch == nil || ch.to != Up || f.m.state != Up {
		t.Fatalf("after the hold: change %+v, state %v", ch, f.m.state)
	}
	if p := f.m.penaltyNow(d, f.now); p > 1 {
		t.Fatalf("up with penalty %v above 1", p)
	}
}

func TestDampingIsBounded(t *testing.T) {
	d := Damping{HalfLife: 10 * time.Second, MaxHold: 30 * time.Second}
	f := newFeeder(t, Spec{Kind: KindTCP, Rise: 1, Fall: 1}, d)
	f.run([]Result{pass}, []State{Up})
	// Flap every second for a long time; force the target up between flaps
	// so each down counts.
	for range 200 {
		f.step(time.Second, fail)
		f.m.state = Up
	}
	f.m.state = Down
	if f.m.penalty > d.ceiling()+1e-9 {
		t.Fatalf("penalty %v above ceiling %v", f.m.penalty, d.ceiling())
	}
	f.step(time.Second, pass)
	if h := f.m.heldUntil.Sub(f.now); h <= 0 || h > d.MaxHold {
		t.Fatalf("hold %v, want within (0, %v]", h, d.MaxHold)
	}
	// MaxHold later it is back.
	f.step(d.MaxHold+time.Millisecond, pass)
	if f.m.state != Up {
		t.Fatalf("still %v after MaxHold", f.m.state)
	}
}

func TestSpecDefaultsAndValidation(t *testing.T) {
	s := Spec{Kind: KindHTTPS}.WithDefaults()
	want := Spec{Kind: KindHTTPS, Path: "/", StatusMin: 200, StatusMax: 399,
		Interval: DefaultInterval, Timeout: DefaultTimeout, Rise: DefaultRise, Fall: DefaultFall}
	if s != want {
		t.Fatalf("defaults: %+v, want %+v", s, want)
	}
	if s := (Spec{Kind: KindTCP, Interval: 100 * time.Millisecond}).WithDefaults(); s.Timeout != 100*time.Millisecond {
		t.Fatalf("default timeout %v exceeds a short interval", s.Timeout)
	}

	bad := map[string]Spec{
		"unknown kind":        {Kind: 9},
		"interval too short":  {Kind: KindTCP, Interval: time.Millisecond},
		"timeout > interval":  {Kind: KindTCP, Interval: time.Second, Timeout: 2 * time.Second},
		"negative rise":       {Kind: KindTCP, Rise: -1},
		"path on tcp":         {Kind: KindTCP, Path: "/x"},
		"status on tcp":       {Kind: KindTCP, StatusMin: 200, StatusMax: 299},
		"relative path":       {Kind: KindHTTP, Path: "healthz"},
		"path with space":     {Kind: KindHTTP, Path: "/a b"},
		"host with slash":     {Kind: KindHTTP, Host: "a/b"},
		"status inverted":     {Kind: KindHTTP, StatusMin: 400, StatusMax: 200},
		"status out of range": {Kind: KindHTTP, StatusMin: 200, StatusMax: 700},
		"skip verify on http": {Kind: KindHTTP, InsecureSkipVerify: true},
		"unknown initial":     {Kind: KindTCP, Initial: 7},
	}
	for name, s := range bad {
		if err := s.WithDefaults().Validate(); err == nil {
			t.Errorf("%s: accepted %+v", name, s)
		}
	}
	for _, s := range []Spec{{}, {Kind: KindTCP}, {Kind: KindHTTP, StatusMin: 500, StatusMax: 503}, {Kind: KindHTTPS, Host: "a.example:8443", InsecureSkipVerify: true}} {
		if err := s.WithDefaults().Validate(); err != nil {
			t.Errorf("rejected %+v: %v", s, err)
		}
	}
}

func TestJitter(t *testing.T) {
	const interval = time.Second
	var buckets [10]int
	for range 10000 {
		d := firstDelay(interval)
		if d < 0 || d >= interval {
			t.Fatalf("first delay %v outside [0, %v)", d, interval)
		}
		buckets[d*10/interval]++
		if g := nextGap(interval); g < 900*time.Millisecond || g > 1100*time.Millisecond {
			t.Fatalf("gap %v outside interval ±10%%", g)
		}
	}
	for _, tt := range []struct{ interval, grid time.Duration }{{time.Second, 25 * time.Millisecond}, {100 * time.Millisecond, 10 * time.Millisecond}} {
		for range 1000 {
			at := t0.Add(rand.N(time.Hour))
			g := onGrid(at, tt.interval)
			if g.Before(at) || g.Sub(at) >= tt.grid || g.Truncate(tt.grid) != g {
				t.Fatalf("onGrid(%v, %v) = %v, want the next multiple of %v", at, tt.interval, g, tt.grid)
			}
		}
	}
	// Uniform spread: each tenth of the interval gets about 1,000 of 10,000
	// first probes. 700 is far outside chance (about 10 standard deviations).
	for i, n := range buckets {
		if n < 700 {
			t.Fatalf("first probes bunch up: bucket %d has %d of 10000 (%v)", i, n, buckets)
		}
	}
}
