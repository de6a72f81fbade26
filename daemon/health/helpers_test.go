package health

import (
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// waitTimeout bounds every wait in these tests. It is generous on purpose:
// the tests run under -race on a loaded 2-core machine, and they wait for
// events rather than sleeping a fixed time, so a long bound costs nothing
// when things work.
const waitTimeout = 15 * time.Second

func addrPort(t *testing.T, a net.Addr) netip.AddrPort {
	t.Helper()
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		t.Fatalf("parse address %v: %v", a, err)
	}
	return ap
}

// acceptListener accepts connections and closes them at once, like a TCP
// service that is up.
func acceptListener(t *testing.T, network, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln
}

// hangListener accepts connections and never answers on them: a backend that
// is wedged above the kernel.
func hangListener(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return ln
}

// synDropAddr returns an address whose listener never completes a handshake:
// its accept queue (backlog 0 holds one connection) is full and never
// drained, so Linux drops further SYNs and connect() hangs.
func synDropAddr(t *testing.T) netip.AddrPort {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socket: %v", err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("bind: %v", err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatalf("listen: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("getsockname: %v", err)
	}
	ap := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(sa.(*syscall.SockaddrInet4).Port))
	for range 8 {
		c, err := net.DialTimeout("tcp", ap.String(), 200*time.Millisecond)
		if err != nil {
			return ap
		}
		t.Cleanup(func() { c.Close() })
	}
	t.Fatal("accept queue never filled: cannot build a listener that drops SYNs")
	return ap
}

// statusServer answers every request with the status code it holds, and
// records what it saw.
type statusServer struct {
	*httptest.Server
	code     atomic.Int32
	requests atomic.Int64
	mu       sync.Mutex
	lastHost string
	lastURI  string
}

func newStatusServer(t *testing.T, code int) *statusServer {
	t.Helper()
	s := &statusServer{}
	s.code.Store(int32(code))
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

func (s *statusServer) serve(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	s.mu.Lock()
	s.lastHost, s.lastURI = r.Host, r.RequestURI
	s.mu.Unlock()
	code := int(s.code.Load())
	// /status/NNN overrides the held code, for table tests.
	if rest, ok := strings.CutPrefix(r.URL.Path, "/status/"); ok {
		if n, err := strconv.Atoi(rest); err == nil {
			code = n
		}
	}
	if code >= 300 && code < 400 {
		w.Header().Set("Location", "/elsewhere")
	}
	w.WriteHeader(code)
}

func (s *statusServer) seen() (host, uri string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastHost, s.lastURI
}

func (s *statusServer) addr(t *testing.T) netip.AddrPort {
	return addrPort(t, s.Listener.Addr())
}

// recorder collects transitions pushed by a Checker.
type recorder struct {
	mu  sync.Mutex
	all []Transition
}

func (r *recorder) notify(tr Transition) {
	r.mu.Lock()
	r.all = append(r.all, tr)
	r.mu.Unlock()
}

func (r *recorder) of(key string) []Transition {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Transition
	for _, tr := range r.all {
		if tr.Key == key {
			out = append(out, tr)
		}
	}
	return out
}

// wait returns the n-th (1-based) transition of key, waiting for it.
func (r *recorder) wait(t *testing.T, key string, n int) Transition {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		if trs := r.of(key); len(trs) >= n {
			return trs[n-1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("target %s: transition %d never came; got %v", key, n, r.of(key))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// expect waits for the n-th transition of key and checks where it went.
func (r *recorder) expect(t *testing.T, key string, n int, from, to State) Transition {
	t.Helper()
	tr := r.wait(t, key, n)
	if tr.From != from || tr.To != to {
		t.Fatalf("target %s transition %d: got %v→%v (%s), want %v→%v", key, n, tr.From, tr.To, tr.Reason, from, to)
	}
	return tr
}

func newChecker(t *testing.T, o Options) (*Checker, *recorder) {
	t.Helper()
	rec := &recorder{}
	o.Notify = rec.notify
	c := New(o)
	t.Cleanup(c.Stop)
	return c, rec
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
