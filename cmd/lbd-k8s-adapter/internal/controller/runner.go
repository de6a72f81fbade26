package controller

import (
	"context"
	"time"
)

// Runner runs a function when triggered, never more often than MinInterval (triggers in
// between are coalesced into one run), at least every MaxInterval, and again after a
// failure with exponential backoff, like kube-proxy's bounded-frequency runner.
type Runner struct {
	fn          func(ctx context.Context) error
	minInterval time.Duration
	maxInterval time.Duration
	retryMin    time.Duration
	retryMax    time.Duration
	signal      chan struct{}
}

// NewRunner returns a runner of fn; call Run to start it.
func NewRunner(fn func(ctx context.Context) error, minInterval, maxInterval time.Duration) *Runner {
	return &Runner{
		fn:          fn,
		minInterval: minInterval,
		maxInterval: maxInterval,
		retryMin:    500 * time.Millisecond,
		retryMax:    30 * time.Second,
		signal:      make(chan struct{}, 1),
	}
}

// Trigger asks for a run. It never blocks: a pending trigger already covers this one.
func (r *Runner) Trigger() {
	select {
	case r.signal <- struct{}{}:
	default:
	}
}

// Run runs fn once at start, then as triggered, until ctx is done.
func (r *Runner) Run(ctx context.Context) {
	periodic := time.NewTimer(0)
	defer periodic.Stop()
	retry := time.NewTimer(0)
	retry.Stop()
	defer retry.Stop()
	var last time.Time
	backoff := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.signal:
		case <-periodic.C:
		case <-retry.C:
		}
		if wait := time.Until(last.Add(r.minInterval)); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		// This run covers every trigger that arrived until now.
		select {
		case <-r.signal:
		default:
		}
		last = time.Now()
		err := r.fn(ctx)
		periodic.Reset(r.maxInterval)
		retry.Stop()
		if err == nil || ctx.Err() != nil {
			backoff = 0
			continue
		}
		backoff = min(max(2*backoff, r.retryMin), r.retryMax)
		retry.Reset(backoff)
	}
}
