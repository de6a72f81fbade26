package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// stuckAfter is how long one sync may run before liveness fails: every lbd call is
// bounded by lbdCallTimeout, so a sync that takes longer is wedged.
const stuckAfter = 2 * time.Minute

// Health is what the adapter's probes report: readiness once the informers are synced and
// the last sync programmed lbd; liveness unless a sync is stuck.
type Health struct {
	mu        sync.Mutex
	informers bool
	syncing   time.Time // start of the running sync; zero when none runs
	lastErr   error
	applied   bool
	now       func() time.Time
}

// NewHealth returns the state of an adapter that has not started.
func NewHealth() *Health { return &Health{now: time.Now} }

func (h *Health) setInformersSynced() {
	h.mu.Lock()
	h.informers = true
	h.mu.Unlock()
}

func (h *Health) syncStarted() {
	h.mu.Lock()
	h.syncing = h.now()
	h.mu.Unlock()
}

func (h *Health) syncEnded(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.syncing, h.lastErr = time.Time{}, err
	h.applied = h.applied || err == nil
}

// Ready returns nil when the adapter is ready: its informers synced and its last sync
// programmed lbd.
func (h *Health) Ready() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case !h.informers:
		return errors.New("informer caches not synced yet")
	case h.lastErr != nil:
		return fmt.Errorf("last sync failed: %w", h.lastErr)
	case !h.applied:
		return errors.New("lbd not programmed yet")
	}
	return nil
}

// Live returns nil unless a sync has been running for longer than any sync may.
func (h *Health) Live() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.syncing.IsZero() && h.now().Sub(h.syncing) > stuckAfter {
		return fmt.Errorf("a sync has been running since %s", h.syncing.Format(time.RFC3339))
	}
	return nil
}

// Serve answers /healthz (liveness) and /readyz (readiness) on ln until ctx is done: 200
// "ok", or 503 with the reason.
func (h *Health) Serve(ctx context.Context, ln net.Listener) error {
	mux := http.NewServeMux()
	probe := func(check func() error) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			if err := check(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		}
	}
	mux.Handle("/healthz", probe(h.Live))
	mux.Handle("/readyz", probe(h.Ready))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve probes: %w", err)
	}
	return nil
}
