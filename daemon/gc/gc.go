// Package gc removes expired conntrack (LB nodes) and NAT (backend nodes) entries: the
// kernel keeps an entry until someone deletes it (conntrack) or evicts it only under
// pressure (NAT, an LRU), so the collector keeps the tables from filling with dead flows,
// at an interval that adapts to how much each pass finds and to what a pass costs.
package gc

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Table is a map the collector sweeps.
type Table interface {
	// Name identifies the table in logs and metrics ("conntrack", "nat").
	Name() string
	// Sweep deletes every entry expired at the kernel's monotonic time now (and what
	// else the table gives back under pressure) and says what it did.
	Sweep(now time.Duration) (Sweep, error)
}

// Sweep is what one pass over a table did.
type Sweep struct {
	// Scanned entries were read, Deleted of them deleted.
	Scanned, Deleted int
	// Fill is how full the table is after the pass: live entries over the entries it
	// can hold (for a table of several maps, the fullest map's).
	Fill float64
}

// Interval bounds and adapts the time between passes.
type Interval struct {
	Min, Max, Start time.Duration
}

// Validate checks the bounds.
func (iv Interval) Validate() error {
	if iv.Min <= 0 || iv.Max < iv.Min || iv.Start < iv.Min || iv.Start > iv.Max {
		return fmt.Errorf("gc interval: need 0 < min ≤ start ≤ max, got min %v start %v max %v", iv.Min, iv.Start, iv.Max)
	}
	return nil
}

// Next returns the interval after a pass that deleted deleted of scanned entries: half as
// long when more than 25% were expired (the table churns: collect sooner), 1.5× longer
// when under 5% were (little to do), unchanged otherwise; always within [Min, Max].
func (iv Interval) Next(cur time.Duration, scanned, deleted int) time.Duration {
	switch {
	case scanned > 0 && deleted*4 > scanned:
		cur /= 2
	case scanned == 0 || deleted*20 < scanned:
		cur = cur * 3 / 2
	}
	return min(max(cur, iv.Min), iv.Max)
}

// Pass is the result of one sweep, for metrics.
type Pass struct {
	Table string
	Sweep
	Duration time.Duration
	Next     time.Duration
	Err      error
}

// dutyCycle bounds the collector's cost: the next pass starts no sooner than this many
// times the last pass's duration after it ended, so that a table that is large or under
// a flood of new entries never takes more than 1/(dutyCycle+1) of a CPU to collect.
const dutyCycle = 10

// Bounded returns the interval after a pass that took took: at least dutyCycle times
// took, even above Max.
func Bounded(next, took time.Duration) time.Duration { return max(next, dutyCycle*took) }

// Run sweeps t until ctx ends, calling observe after each pass. now returns the kernel's
// monotonic clock (CLOCK_MONOTONIC, as bpf_ktime_get_ns sees it).
func Run(ctx context.Context, t Table, iv Interval, now func() time.Duration, observe func(Pass), log hclog.Logger) {
	cur := iv.Start
	timer := time.NewTimer(cur)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		start := time.Now()
		sw, err := t.Sweep(now())
		p := Pass{Table: t.Name(), Sweep: sw, Duration: time.Since(start), Err: err}
		if err != nil {
			log.Warn("gc pass failed", "op", "gc", "table", t.Name(), "error", err)
		} else {
			cur = iv.Next(cur, sw.Scanned, sw.Deleted)
		}
		p.Next = Bounded(cur, p.Duration)
		log.Debug("gc pass", "op", "gc", "table", t.Name(), "scanned", sw.Scanned, "deleted", sw.Deleted, "fill", sw.Fill, "took", p.Duration, "next", p.Next)
		if observe != nil {
			observe(p)
		}
		timer.Reset(p.Next)
	}
}
