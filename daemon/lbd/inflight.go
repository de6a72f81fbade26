package lbd

import (
	"context"
	"sync"

	"google.golang.org/grpc"
)

// inflight counts the API's handlers that have not returned, so that a stop knows when
// every call is over even while gRPC's graceful stop still waits: a stream whose handler
// returned stays open until the client has read every reply queued before its status,
// and a client that stopped reading (a watch suspended with Ctrl-Z, a stuck controller)
// never does.
type inflight struct {
	mu       sync.Mutex
	n        int
	draining bool
	idle     chan struct{} // closed once draining and n is 0
}

func newInflight() *inflight { return &inflight{idle: make(chan struct{})} }

func (f *inflight) enter() {
	f.mu.Lock()
	f.n++
	f.mu.Unlock()
}

func (f *inflight) leave() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
	f.closeIfIdle()
}

// drain returns a channel closed once no handler runs, from now on.
func (f *inflight) drain() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.draining = true
	f.closeIfIdle()
	return f.idle
}

// running returns how many handlers have not returned.
func (f *inflight) running() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

// closeIfIdle: caller holds mu.
func (f *inflight) closeIfIdle() {
	if !f.draining || f.n != 0 {
		return
	}
	select {
	case <-f.idle:
	default:
		close(f.idle)
	}
}

func (f *inflight) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	f.enter()
	defer f.leave()
	return handler(ctx, req)
}

func (f *inflight) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	f.enter()
	defer f.leave()
	return handler(srv, ss)
}
