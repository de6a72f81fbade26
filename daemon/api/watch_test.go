package api_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/daemon/api"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// watchSynced opens a watch and reads it up to SYNCED.
func watchSynced(t *testing.T, c *clients, wctx context.Context) lbdv1.LoadBalancerService_WatchServicesClient {
	t.Helper()
	stream, err := c.lb.WatchServices(wctx, &lbdv1.WatchServicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatalf("watch before SYNCED: %v", err)
		}
		if ev.Type == lbdv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED {
			return stream
		}
	}
}

// TestWatcherLimit: past max watchers, a watch is refused with RESOURCE_EXHAUSTED naming
// the setting; once one ends, a new one is served.
func TestWatcherLimit(t *testing.T) {
	c := startOpts(t, store.DefaultLimits(), api.Options{MaxWatchers: 3})
	var cancels []context.CancelFunc
	for range 3 {
		wctx, cancel := context.WithCancel(ctx(t))
		cancels = append(cancels, cancel)
		watchSynced(t, c, wctx)
	}
	stream, err := c.lb.WatchServices(ctx(t), &lbdv1.WatchServicesRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "api.max_watchers") {
		t.Fatalf("a fourth watch: %v, want RESOURCE_EXHAUSTED naming api.max_watchers", err)
	}
	cancels[0]()
	deadline := time.Now().Add(10 * time.Second)
	for {
		wctx, cancel := context.WithCancel(ctx(t))
		stream, err := c.lb.WatchServices(wctx, &lbdv1.WatchServicesRequest{})
		if err == nil {
			_, err = stream.Recv()
		}
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no watch served after one of three ended: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSlowWatcherIsEnded: a watcher that stops reading while changes go on is ended with
// RESOURCE_EXHAUSTED once it falls more than the backlog behind (it reads what was
// already sent first), the store is never held up, and a watcher that keeps reading the
// same changes sees every one.
func TestSlowWatcherIsEnded(t *testing.T) {
	const backlog, changes = 100, 1500
	c := startOpts(t, store.DefaultLimits(), api.Options{WatchBacklog: backlog, MaxWatchers: 2})
	if _, err := c.lb.CreateService(ctx(t), &lbdv1.CreateServiceRequest{Service: web()}); err != nil {
		t.Fatal(err)
	}
	slow := watchSynced(t, c, ctx(t))
	fast := watchSynced(t, c, ctx(t))
	var wg sync.WaitGroup
	var seen []uint32
	var fastErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for len(seen) < changes {
			ev, err := fast.Recv()
			if err != nil {
				fastErr = err
				return
			}
			seen = append(seen, ev.Service.Backends[0].Weight)
		}
	}()
	start := time.Now()
	for i := range changes {
		if _, err := c.lb.UpdateBackend(ctx(t), &lbdv1.UpdateBackendRequest{ServiceName: "web",
			Backend: &lbdv1.Backend{Address: "198.18.1.1", Port: 8080, Weight: uint32(i%2 + 2)}}); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d changes in %v", changes, time.Since(start))
	wg.Wait()
	if fastErr != nil || len(seen) != changes {
		t.Fatalf("the reading watcher saw %d of %d changes (%v)", len(seen), changes, fastErr)
	}
	for i, w := range seen {
		if w != uint32(i%2+2) {
			t.Fatalf("change %d: weight %d, want %d: changes lost or reordered", i, w, i%2+2)
		}
	}
	n := 0
	for {
		_, err := slow.Recv()
		if err == nil {
			n++
			continue
		}
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), fmt.Sprintf("more than %d changes behind (api.watch_backlog)", backlog)) {
			t.Fatalf("the watcher that stopped reading ended with %v after %d changes, want RESOURCE_EXHAUSTED naming api.watch_backlog", err, n)
		}
		break
	}
	if n >= changes {
		t.Fatalf("the watcher that stopped reading got all %d changes: it was never behind", n)
	}
	t.Logf("the watcher that stopped reading got %d changes before the end", n)
	// Its place is free again.
	watchSynced(t, c, ctx(t))
}
