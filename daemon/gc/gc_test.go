package gc

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

func TestNextAdapts(t *testing.T) {
	iv := Interval{Min: time.Second, Max: time.Minute, Start: 10 * time.Second}
	cases := []struct {
		name             string
		cur              time.Duration
		scanned, deleted int
		want             time.Duration
	}{
		{"churn halves", 10 * time.Second, 100, 26, 5 * time.Second},
		{"exactly 25% keeps", 10 * time.Second, 100, 25, 10 * time.Second},
		{"quiet grows 1.5x", 10 * time.Second, 100, 4, 15 * time.Second},
		{"exactly 5% keeps", 10 * time.Second, 100, 5, 10 * time.Second},
		{"empty table grows", 10 * time.Second, 0, 0, 15 * time.Second},
		{"floor", 1500 * time.Millisecond, 10, 10, time.Second},
		{"ceiling", 50 * time.Second, 1000, 0, time.Minute},
	}
	for _, c := range cases {
		if got := iv.Next(c.cur, c.scanned, c.deleted); got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
	if err := (Interval{Min: time.Second, Max: time.Millisecond, Start: time.Second}).Validate(); err == nil {
		t.Error("max < min accepted")
	}
}

type fakeTable struct {
	mu     sync.Mutex
	passes int
	took   time.Duration
}

func (f *fakeTable) Name() string { return "fake" }
func (f *fakeTable) Sweep(time.Duration) (Sweep, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.passes++
	time.Sleep(f.took)
	return Sweep{Scanned: 100, Deleted: 50}, nil
}

func TestRunShortensIntervalUnderChurn(t *testing.T) {
	iv := Interval{Min: 5 * time.Millisecond, Max: time.Second, Start: 80 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var nexts []time.Duration
	done := make(chan struct{})
	go func() {
		Run(ctx, &fakeTable{}, iv, func() time.Duration { return 0 }, func(p Pass) {
			mu.Lock()
			defer mu.Unlock()
			nexts = append(nexts, p.Next)
			if len(nexts) == 5 {
				cancel()
			}
		}, hclog.NewNullLogger())
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("gc did not run five passes")
	}
	want := []time.Duration{40, 20, 10, 5, 5}
	for i, w := range want {
		if nexts[i] != w*time.Millisecond {
			t.Fatalf("intervals %v, want %v ms", nexts, want)
		}
	}
}

// TestRunBoundsItsCost: a pass that takes long pushes the next one out to ten times
// its duration, whatever the adaptive interval asks for.
func TestRunBoundsItsCost(t *testing.T) {
	iv := Interval{Min: time.Millisecond, Max: 5 * time.Millisecond, Start: time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan Pass, 1)
	go Run(ctx, &fakeTable{took: 20 * time.Millisecond}, iv, func() time.Duration { return 0 }, func(p Pass) {
		select {
		case done <- p:
		default:
		}
		cancel()
	}, hclog.NewNullLogger())
	select {
	case p := <-done:
		if p.Next < 10*p.Duration || p.Duration < 20*time.Millisecond {
			t.Errorf("pass took %v, next in %v: want at least ten times as long", p.Duration, p.Next)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no pass")
	}
	if got := Bounded(time.Second, 50*time.Millisecond); got != time.Second {
		t.Errorf("Bounded(1s, 50ms) = %v", got)
	}
	if got := Bounded(time.Second, 500*time.Millisecond); got != 5*time.Second {
		t.Errorf("Bounded(1s, 500ms) = %v", got)
	}
}
