package controller

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// startRunner runs r until the test ends.
func startRunner(t *testing.T, r *Runner) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestRunnerCoalescesTriggers(t *testing.T) {
	var runs atomic.Int32
	r := NewRunner(func(context.Context) error { runs.Add(1); return nil }, 300*time.Millisecond, time.Hour)
	startRunner(t, r)
	waitFor(t, "the initial run", func() bool { return runs.Load() == 1 })
	start := time.Now()
	for range 20 {
		r.Trigger()
	}
	waitFor(t, "the triggered run", func() bool { return runs.Load() == 2 })
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Errorf("second run after %v, want at least the 300ms minimum interval", d)
	}
	time.Sleep(500 * time.Millisecond)
	if n := runs.Load(); n != 2 {
		t.Errorf("%d runs, want 2: twenty triggers within the interval are one run", n)
	}
}

func TestRunnerRetriesFailures(t *testing.T) {
	var runs atomic.Int32
	r := NewRunner(func(context.Context) error {
		if runs.Add(1) < 3 {
			return errors.New("lbd down")
		}
		return nil
	}, 0, time.Hour)
	r.retryMin = 10 * time.Millisecond
	startRunner(t, r)
	waitFor(t, "two retries without any trigger", func() bool { return runs.Load() == 3 })
	time.Sleep(200 * time.Millisecond)
	if n := runs.Load(); n != 3 {
		t.Errorf("%d runs, want 3: no retry after a success", n)
	}
}

func TestRunnerRunsPeriodically(t *testing.T) {
	var runs atomic.Int32
	r := NewRunner(func(context.Context) error { runs.Add(1); return nil }, 0, 30*time.Millisecond)
	startRunner(t, r)
	waitFor(t, "periodic runs", func() bool { return runs.Load() >= 4 })
}

func TestTracker(t *testing.T) {
	tr := newTracker()
	tr.service("ns/b")
	tr.service("ns/a")
	tr.service("ns/b")
	keys, all := tr.take()
	if !slices.Equal(keys, []string{"ns/a", "ns/b"}) || all {
		t.Errorf("take = %v %v, want [ns/a ns/b] false", keys, all)
	}
	if keys, all := tr.take(); len(keys) != 0 || all {
		t.Errorf("second take = %v %v, want nothing", keys, all)
	}
	tr.everything()
	if _, all := tr.take(); !all {
		t.Error("everything() not reported")
	}
}
