package health

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Probe timing for end-to-end tests: short enough to be quick, long enough
// that a local probe never times out spuriously under -race on a loaded
// machine.
const (
	testInterval = 100 * time.Millisecond
	testTimeout  = 100 * time.Millisecond
)

func httpSpec(rise, fall int) Spec {
	return Spec{Kind: KindHTTP, Interval: testInterval, Timeout: testTimeout, Rise: rise, Fall: fall}
}

// syncBuffer is a log sink safe for the checker's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// lines returns the JSON log lines with the given message.
func (s *syncBuffer) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if m["@message"] == msg {
			out = append(out, m)
		}
	}
	return out
}

func jsonLogger(buf *syncBuffer) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Output: buf, JSONFormat: true, Level: hclog.Info})
}

func TestCheckerRiseFallEachKind(t *testing.T) {
	httpSrv := newStatusServer(t, 200)
	tlsSrv := &statusServer{}
	tlsSrv.code.Store(200)
	tlsSrv.Server = httptest.NewTLSServer(http.HandlerFunc(tlsSrv.serve))
	t.Cleanup(tlsSrv.Close)
	roots := x509.NewCertPool()
	roots.AddCert(tlsSrv.Certificate())
	tcpLn := acceptListener(t, "tcp", "127.0.0.1:0")

	logs := &syncBuffer{}
	c, rec := newChecker(t, Options{Logger: jsonLogger(logs), RootCAs: roots})
	tcpSpec := Spec{Kind: KindTCP, Interval: testInterval, Timeout: testTimeout, Rise: 2, Fall: 3}
	httpsSpec := httpSpec(2, 3)
	httpsSpec.Kind, httpsSpec.Host = KindHTTPS, "example.com"
	targets := []Target{
		{Key: "tcp", Addr: addrPort(t, tcpLn.Addr()), Spec: tcpSpec},
		{Key: "http", Addr: httpSrv.addr(t), Spec: httpSpec(2, 3)},
		{Key: "https", Addr: tlsSrv.addr(t), Spec: httpsSpec},
	}
	if err := c.Set(targets); err != nil {
		t.Fatalf("set: %v", err)
	}
	for _, tg := range targets {
		tr := rec.expect(t, tg.Key, 1, Unknown, Up)
		if !tr.Status.Last.OK || tr.Status.Checks == 0 {
			t.Fatalf("%s: up transition without a passing probe: %+v", tg.Key, tr.Status)
		}
	}

	// Break each backend in its own way.
	tcpLn.Close()
	httpSrv.code.Store(503)
	tlsSrv.code.Store(500)
	for _, tg := range targets {
		tr := rec.expect(t, tg.Key, 2, Up, Down)
		if tr.Status.ConsecutiveFailed != 3 || tr.Status.Last.OK {
			t.Fatalf("%s went down after %d failures, want fall=3: %+v", tg.Key, tr.Status.ConsecutiveFailed, tr.Status)
		}
		if !strings.Contains(tr.Reason, "3 consecutive failed probes") {
			t.Fatalf("%s: reason %q", tg.Key, tr.Reason)
		}
	}
	if tr := rec.wait(t, "http", 2); tr.Status.Last.Code != 503 || !strings.Contains(tr.Reason, "status 503") {
		t.Fatalf("http down without the status in it: %+v", tr)
	}

	// Repair the HTTP ones: each needs rise=2 passes.
	httpSrv.code.Store(200)
	tlsSrv.code.Store(204)
	for _, key := range []string{"http", "https"} {
		tr := rec.expect(t, key, 3, Down, Up)
		if tr.Status.ConsecutiveOK != 2 {
			t.Fatalf("%s came back after %d passes, want rise=2", key, tr.Status.ConsecutiveOK)
		}
		if st, _ := c.Status(key); st.State != Up || !st.LastTransition.Equal(tr.At) {
			t.Fatalf("%s status %+v does not match transition at %v", key, st, tr.At)
		}
	}
	if st, _ := c.Status("tcp"); st.State != Down || st.Usable() {
		t.Fatalf("tcp with a closed listener: %+v", st)
	}

	// Every transition is logged exactly once, with key/value fields.
	c.Stop()
	logged := logs.lines(t, "backend health changed")
	rec.mu.Lock()
	delivered := len(rec.all)
	rec.mu.Unlock()
	if len(logged) != delivered || delivered != 3+3+2 {
		t.Fatalf("%d transitions logged, %d delivered, want 8 each", len(logged), delivered)
	}
	seen := map[string]int{}
	for _, l := range logged {
		seen[fmt.Sprintf("%v %v→%v", l["target"], l["from"], l["to"])]++
		if l["op"] != "health" || l["reason"] == "" {
			t.Fatalf("log line lacks fields: %v", l)
		}
	}
	for key, n := range seen {
		if n != 1 {
			t.Fatalf("%s logged %d times", key, n)
		}
	}
}

func TestCheckerSetKeepsState(t *testing.T) {
	ok := newStatusServer(t, 200)
	c, rec := newChecker(t, Options{})
	a := Target{Key: "a", Addr: ok.addr(t), Spec: httpSpec(1, 2)}
	b := Target{Key: "b", Addr: ok.addr(t), Spec: httpSpec(1, 2)}
	gone := Target{Key: "gone", Addr: ok.addr(t), Spec: httpSpec(1, 2)}
	if err := c.Set([]Target{a, b, gone}); err != nil {
		t.Fatalf("set: %v", err)
	}
	upA := rec.expect(t, "a", 1, Unknown, Up)
	upB := rec.expect(t, "b", 1, Unknown, Up)
	rec.expect(t, "gone", 1, Unknown, Up)

	// a unchanged, b with new timing, gone removed, fresh added.
	b2 := b
	b2.Spec.Interval, b2.Spec.Rise = 2*testInterval, 3
	fresh := Target{Key: "fresh", Addr: ok.addr(t), Spec: httpSpec(1, 2)}
	before, _ := c.Status("a")
	if err := c.Set([]Target{fresh, b2, a}); err != nil {
		t.Fatalf("set: %v", err)
	}
	for key, up := range map[string]Transition{"a": upA, "b": upB} {
		st, found := c.Status(key)
		if !found || st.State != Up || !st.LastTransition.Equal(up.At) {
			t.Fatalf("%s lost its state across Set: %+v", key, st)
		}
	}
	if _, found := c.Status("gone"); found {
		t.Fatal("removed target still reported")
	}
	if st, _ := c.Status("fresh"); st.State != Unknown {
		t.Fatalf("new target starts %v", st.State)
	}
	if keys := statusKeys(c.Statuses()); keys != "a b fresh" {
		t.Fatalf("statuses for %q", keys)
	}
	// The kept target goes on being probed from where it was.
	waitUntil(t, "more probes of a", func() bool {
		st, _ := c.Status("a")
		return st.Checks >= before.Checks+3
	})

	// A changed probe keeps the state but restarts the count: the broken
	// path takes fall=2 fresh failures to bring b down.
	b3 := b2
	b3.Spec.Path = "/status/500"
	if err := c.Set([]Target{a, b3, fresh}); err != nil {
		t.Fatalf("set: %v", err)
	}
	if st, _ := c.Status("b"); st.State != Up || st.ConsecutiveOK != 0 {
		t.Fatalf("b after probe change: %+v, want up with counters reset", st)
	}
	down := rec.expect(t, "b", 2, Up, Down)
	if down.Status.Last.Code != 500 {
		t.Fatalf("b went down on %+v, not on the new probe", down.Status.Last)
	}

	// Turning the check off brings it back up at once, pushed like any
	// other transition.
	b4 := b3
	b4.Spec = Spec{}
	if err := c.Set([]Target{a, b4, fresh}); err != nil {
		t.Fatalf("set: %v", err)
	}
	if tr := rec.expect(t, "b", 3, Down, Up); tr.Reason != "health check disabled" {
		t.Fatalf("reason %q", tr.Reason)
	}
	if n := len(rec.of("a")); n != 1 {
		t.Fatalf("a made %d transitions across Set calls, want 1", n)
	}
}

func statusKeys(sts []Status) string {
	keys := make([]string, len(sts))
	for i, st := range sts {
		keys[i] = st.Key
	}
	return strings.Join(keys, " ")
}

func TestCheckerSetRejectsBadInput(t *testing.T) {
	srv := newStatusServer(t, 200)
	c, _ := newChecker(t, Options{})
	good := Target{Key: "good", Addr: srv.addr(t), Spec: httpSpec(1, 1)}
	if err := c.Set([]Target{good}); err != nil {
		t.Fatalf("set: %v", err)
	}
	other := Target{Key: "other", Addr: srv.addr(t), Spec: httpSpec(1, 1)}
	for name, ts := range map[string][]Target{
		"duplicate key": {other, other},
		"bad spec":      {other, {Key: "x", Addr: srv.addr(t), Spec: Spec{Kind: KindTCP, Path: "/"}}},
		"empty key":     {other, {Addr: srv.addr(t), Spec: Spec{Kind: KindTCP}}},
		"no port":       {other, {Key: "x", Addr: netip.AddrPortFrom(srv.addr(t).Addr(), 0), Spec: Spec{Kind: KindTCP}}},
	} {
		if err := c.Set(ts); err == nil {
			t.Fatalf("%s: accepted", name)
		}
		if keys := statusKeys(c.Statuses()); keys != "good" {
			t.Fatalf("%s: rejected Set changed the targets to %q", name, keys)
		}
	}
}

func TestCheckerDampsFlaps(t *testing.T) {
	srv := newStatusServer(t, 200)
	logs := &syncBuffer{}
	damping := Damping{HalfLife: 2 * time.Second, MaxHold: 10 * time.Second}
	c, rec := newChecker(t, Options{Logger: jsonLogger(logs), Damping: damping})
	if err := c.Set([]Target{{Key: "k", Addr: srv.addr(t), Spec: httpSpec(1, 2)}}); err != nil {
		t.Fatalf("set: %v", err)
	}
	rec.expect(t, "k", 1, Unknown, Up)

	// First flap: straight back.
	srv.code.Store(500)
	rec.expect(t, "k", 2, Up, Down)
	srv.code.Store(200)
	rec.expect(t, "k", 3, Down, Up)

	// Second flap within the half-life: the return is held.
	srv.code.Store(500)
	rec.expect(t, "k", 4, Up, Down)
	srv.code.Store(200)
	var held Status
	waitUntil(t, "a damping hold", func() bool {
		held, _ = c.Status("k")
		return !held.HeldUntil.IsZero()
	})
	if held.State != Down || held.Penalty <= 1 {
		t.Fatalf("held target: %+v", held)
	}
	up := rec.expect(t, "k", 5, Down, Up)
	if up.At.Before(held.HeldUntil) {
		t.Fatalf("came back at %v, before the hold ended at %v", up.At, held.HeldUntil)
	}
	if n := len(logs.lines(t, "backend return held by flap damping")); n != 1 {
		t.Fatalf("hold logged %d times, want 1", n)
	}
}

// TestCheckerStop checks that Stop ends every goroutine, including probes
// stuck on hung servers, and that the Checker refuses work afterwards.
func TestCheckerStop(t *testing.T) {
	before := runtime.NumGoroutine()
	// Servers live in a subtest so their cleanup runs before goroutines are
	// counted.
	t.Run("probe and stop", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		defer srv.Close()
		hung := hangListener(t)
		drop := synDropAddr(t)
		c := New(Options{})
		var ts []Target
		fast := Spec{Interval: 20 * time.Millisecond, Timeout: 20 * time.Millisecond, Rise: 1, Fall: 1}
		for i := range 30 {
			s := fast
			s.Kind = []Kind{KindTCP, KindHTTP, KindHTTPS}[i%3]
			addr := addrPort(t, srv.Listener.Addr())
			if i%2 == 1 {
				addr = addrPort(t, hung.Addr())
			}
			if s.Kind == KindTCP && i%2 == 1 {
				addr = drop
			}
			if s.Kind == KindHTTPS {
				s.InsecureSkipVerify = true
			}
			ts = append(ts, Target{Key: fmt.Sprint(i), Addr: addr, Spec: s})
		}
		if err := c.Set(ts); err != nil {
			t.Fatalf("set: %v", err)
		}
		waitUntil(t, "every target probed", func() bool {
			for _, st := range c.Statuses() {
				if st.Checks < 2 {
					return false
				}
			}
			return true
		})
		c.Stop()
		c.Stop()
		if err := c.Set(ts); !errors.Is(err, ErrStopped) {
			t.Fatalf("set after stop: %v", err)
		}
	})
	// Server-side goroutines of closed connections may take a moment.
	deadline := time.Now().Add(waitTimeout)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines before, %d after Stop:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCheckerSlowNotify checks that a consumer that blocks does not stall
// probing, and still gets every transition in order.
func TestCheckerSlowNotify(t *testing.T) {
	srv := newStatusServer(t, 200)
	release := make(chan struct{})
	var (
		mu  sync.Mutex
		got []Transition
	)
	c := New(Options{Notify: func(tr Transition) {
		<-release
		mu.Lock()
		got = append(got, tr)
		mu.Unlock()
	}})
	defer c.Stop()
	if err := c.Set([]Target{{Key: "k", Addr: srv.addr(t), Spec: httpSpec(1, 1)}}); err != nil {
		t.Fatalf("set: %v", err)
	}
	waitUntil(t, "up", func() bool { st, _ := c.Status("k"); return st.State == Up })
	srv.code.Store(500)
	waitUntil(t, "down while the consumer blocks", func() bool { st, _ := c.Status("k"); return st.State == Down })
	srv.code.Store(200)
	waitUntil(t, "up again", func() bool { st, _ := c.Status("k"); return st.State == Up })
	close(release)
	waitUntil(t, "three deliveries", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 3 })
	mu.Lock()
	defer mu.Unlock()
	if got[0].To != Up || got[1].To != Down || got[2].To != Up {
		t.Fatalf("delivered out of order: %v", got)
	}
}
