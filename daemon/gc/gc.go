// Package gc removes expired conntrack (LB nodes) and NAT (backend nodes) entries. The
// kernel's LRU maps evict only under pressure; the collector keeps them from filling with
// dead flows, at an interval that adapts to how much each pass finds.
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
	// Sweep deletes every entry expired at the kernel's monotonic time now and returns how
	// many entries it looked at and how many it deleted.
	Sweep(now time.Duration) (scanned, deleted int, err error)
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
	Table            string
	Scanned, Deleted int
	Duration         time.Duration
	Next             time.Duration
	Err              error
}

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
		scanned, deleted, err := t.Sweep(now())
		p := Pass{Table: t.Name(), Scanned: scanned, Deleted: deleted, Duration: time.Since(start), Err: err}
		if err != nil {
			log.Warn("gc pass failed", "op", "gc", "table", t.Name(), "error", err)
		} else {
			cur = iv.Next(cur, scanned, deleted)
		}
		p.Next = cur
		log.Debug("gc pass", "op", "gc", "table", t.Name(), "scanned", scanned, "deleted", deleted, "took", p.Duration, "next", cur)
		if observe != nil {
			observe(p)
		}
		timer.Reset(cur)
	}
}
