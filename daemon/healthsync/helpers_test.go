package healthsync

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/daemon/reconcile"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

// waitTimeout bounds every wait. Tests wait for conditions, never for fixed times, so a
// generous bound costs nothing when things work and absorbs a loaded machine under -race.
const waitTimeout = 15 * time.Second

// Probe timing of the tests: the store's shortest interval, and rise/fall 2, so a state
// change takes a few hundred milliseconds.
const (
	testInterval = 100 * time.Millisecond
	testTimeout  = 50 * time.Millisecond
)

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func openStore(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(store.Options{Limits: store.DefaultLimits()})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// toLoopback probes a store backend (the store refuses loopback addresses) at the
// in-process server on 127.0.0.1 that listens on the backend's port.
func toLoopback(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), a.Port())
}

// run starts Run and stops it at cleanup, checking that it returns.
func run(t *testing.T, st *store.Store, o Options) (stop func()) {
	t.Helper()
	if o.probeAddr == nil {
		o.probeAddr = toLoopback
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, st, o)
	}()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case <-done:
		case <-time.After(waitTimeout):
			t.Fatal("Run did not return after its context ended")
		}
	}
	t.Cleanup(stop)
	return stop
}

// runReconciler runs a reconciler over a fake datapath.
func runReconciler(t *testing.T, st *store.Store) *reconcile.Fake {
	t.Helper()
	fake := reconcile.NewFake()
	r := reconcile.New(st, fake, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("reconciler: %v", err)
		}
	})
	return fake
}

// backendServer is an HTTP server on a fixed loopback port that can be stopped and
// started again, like a backend process that dies and is restarted. It answers 200 on
// /healthz and 404 elsewhere, and counts connections (TCP probes send no request).
type backendServer struct {
	t     *testing.T
	port  uint16
	conns atomic.Int64

	mu   sync.Mutex
	srv  *http.Server
	done chan struct{}
}

func newBackendServer(t *testing.T) *backendServer {
	t.Helper()
	b := &backendServer{t: t}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	b.port = uint16(ln.Addr().(*net.TCPAddr).Port)
	b.serve(ln)
	t.Cleanup(b.stop)
	return b
}

func (b *backendServer) serve(ln net.Listener) {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {})
	srv := &http.Server{
		Handler: mux,
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				b.conns.Add(1)
			}
		},
		ReadHeaderTimeout: time.Second,
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			b.t.Errorf("backend server: %v", err)
		}
	}()
	b.mu.Lock()
	b.srv, b.done = srv, done
	b.mu.Unlock()
}

// stop closes the listener and every connection: probes now get "connection refused".
func (b *backendServer) stop() {
	b.mu.Lock()
	srv, done := b.srv, b.done
	b.srv = nil
	b.mu.Unlock()
	if srv == nil {
		return
	}
	srv.Close()
	<-done
}

// start listens again on the same port.
func (b *backendServer) start() {
	b.t.Helper()
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", b.port))
	if err != nil {
		b.t.Fatalf("listen again on port %d: %v", b.port, err)
	}
	b.serve(ln)
}

// backend returns a store backend whose probes reach this server through toLoopback.
func (b *backendServer) backend(addr string) *lbdv1.Backend {
	return &lbdv1.Backend{Address: addr, Port: uint32(b.port)}
}

func httpCheck(path string) *lbdv1.HealthCheck {
	return &lbdv1.HealthCheck{
		Type:     lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_HTTP,
		Path:     path,
		Interval: durationpb.New(testInterval),
		Timeout:  durationpb.New(testTimeout),
		Rise:     2,
		Fall:     2,
	}
}

func tcpCheck() *lbdv1.HealthCheck {
	return &lbdv1.HealthCheck{
		Type:     lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_TCP,
		Interval: durationpb.New(testInterval),
		Timeout:  durationpb.New(testTimeout),
		Rise:     2,
		Fall:     2,
	}
}

func service(name, vip string, hc *lbdv1.HealthCheck, backends ...*lbdv1.Backend) *lbdv1.Service {
	return &lbdv1.Service{
		Name: name, Vip: vip, Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP,
		HealthCheck: hc, Backends: backends,
	}
}

func create(t *testing.T, st *store.Store, svc *lbdv1.Service) *lbdv1.Service {
	t.Helper()
	out, err := st.CreateService(svc)
	if err != nil {
		t.Fatalf("create service %s: %v", svc.Name, err)
	}
	return out
}

// backendOf returns the backend of a service with the given address, or nil.
func backendOf(svc *lbdv1.Service, addr string) *lbdv1.Backend {
	if svc == nil {
		return nil
	}
	for _, b := range svc.Backends {
		if b.Address == addr {
			return b
		}
	}
	return nil
}

// storedHealth reads a backend's health state from the store.
func storedHealth(st *store.Store, name, addr string) lbdv1.HealthState {
	svc, err := st.GetService(name)
	if err != nil {
		return lbdv1.HealthState_HEALTH_STATE_UNSPECIFIED
	}
	return backendOf(svc, addr).GetHealth().GetState()
}

func waitHealth(t *testing.T, st *store.Store, name, addr string, want lbdv1.HealthState) *lbdv1.Service {
	t.Helper()
	eventually(t, fmt.Sprintf("%s backend %s %v", name, addr, want), func() bool {
		return storedHealth(st, name, addr) == want
	})
	svc, err := st.GetService(name)
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// probeLoops counts the checker's probe goroutines (one per probed target).
func probeLoops() int {
	return countGoroutines("health.(*Checker).loop")
}

// countGoroutines counts goroutines whose stack mentions fn.
func countGoroutines(fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, fn) {
			count++
		}
	}
	return count
}
