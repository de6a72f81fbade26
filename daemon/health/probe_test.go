package health

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

func probeOnce(t *testing.T, tg Target, roots *x509.CertPool) Result {
	t.Helper()
	tg.Spec = tg.Spec.WithDefaults()
	if tg.Key == "" {
		tg.Key = "probe"
	}
	if err := tg.validate(); err != nil {
		t.Fatalf("invalid target: %v", err)
	}
	p, err := newProber(tg, roots)
	if err != nil {
		t.Fatalf("new prober: %v", err)
	}
	// A probe that ignores its timeout fails the test instead of hanging it.
	done := make(chan Result, 1)
	go func() { done <- runProbe(context.Background(), p, tg.Spec.Timeout) }()
	select {
	case r := <-done:
		return r
	case <-time.After(tg.Spec.Timeout + waitTimeout):
		t.Fatalf("probe still running %v after its timeout %v", waitTimeout, tg.Spec.Timeout)
		return Result{}
	}
}

func TestTCPProbe(t *testing.T) {
	up := addrPort(t, acceptListener(t, "tcp", "127.0.0.1:0").Addr())

	closedLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	closed := addrPort(t, closedLn.Addr())
	closedLn.Close()

	tcp := Spec{Kind: KindTCP}
	withPort := Spec{Kind: KindTCP, Port: up.Port()}
	tests := []struct {
		name    string
		target  Target
		ok      bool
		errLike string
	}{
		{"listening", Target{Addr: up, Spec: tcp}, true, ""},
		{"refused", Target{Addr: closed, Spec: tcp}, false, "refused"},
		{"port override reaches the listener", Target{Addr: closed, Spec: withPort}, true, ""},
	}
	if ln, err := net.Listen("tcp6", "[::1]:0"); err == nil {
		ln.Close()
		v6 := addrPort(t, acceptListener(t, "tcp6", "[::1]:0").Addr())
		tests = append(tests, struct {
			name    string
			target  Target
			ok      bool
			errLike string
		}{"ipv6", Target{Addr: v6, Spec: tcp}, true, ""})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := probeOnce(t, tt.target, nil)
			if r.OK != tt.ok || !strings.Contains(r.Err, tt.errLike) {
				t.Fatalf("got ok=%v err=%q, want ok=%v err containing %q", r.OK, r.Err, tt.ok, tt.errLike)
			}
			if r.At.IsZero() || r.Latency <= 0 {
				t.Fatalf("result lacks time or latency: %+v", r)
			}
		})
	}
}

// checkTimeout asserts that a probe against a hung server fails as a timeout,
// neither early (it waited) nor very late (the timeout applied).
func checkTimeout(t *testing.T, r Result, timeout time.Duration) {
	t.Helper()
	if r.OK {
		t.Fatalf("probe of a hung server passed: %+v", r)
	}
	if !strings.Contains(r.Err, "timed out after") {
		t.Fatalf("error %q does not say it timed out", r.Err)
	}
	if r.Latency < timeout || r.Latency > timeout+5*time.Second {
		t.Fatalf("latency %v, want about the timeout %v", r.Latency, timeout)
	}
}

func TestProbeTimeouts(t *testing.T) {
	const timeout = 150 * time.Millisecond
	hung := addrPort(t, hangListener(t).Addr())
	tests := []struct {
		name string
		tg   Target
	}{
		{"tcp connect never completes", Target{Addr: synDropAddr(t), Spec: Spec{Kind: KindTCP}}},
		{"http accepted but never answered", Target{Addr: hung, Spec: Spec{Kind: KindHTTP}}},
		{"https handshake never answered", Target{Addr: hung, Spec: Spec{Kind: KindHTTPS, InsecureSkipVerify: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.tg.Spec.Interval, tt.tg.Spec.Timeout = time.Second, timeout
			checkTimeout(t, probeOnce(t, tt.tg, nil), timeout)
		})
	}
}

func TestHTTPProbeStatusRanges(t *testing.T) {
	srv := newStatusServer(t, 200)
	addr := srv.addr(t)
	tests := []struct {
		path     string
		min, max int
		ok       bool
		code     int
	}{
		{"/status/200", 0, 0, true, 200},
		{"/status/204", 0, 0, true, 204},
		{"/status/302", 0, 0, true, 302}, // not followed: /elsewhere would be 200 too, but is never asked
		{"/status/399", 0, 0, true, 399},
		{"/status/404", 0, 0, false, 404},
		{"/status/503", 0, 0, false, 503},
		{"/status/204", 200, 200, false, 204},
		{"/status/200", 200, 200, true, 200},
		{"/status/503", 500, 503, true, 503},
		{"/status/504", 500, 503, false, 504},
	}
	for _, tt := range tests {
		r := probeOnce(t, Target{Addr: addr, Spec: Spec{Kind: KindHTTP, Path: tt.path, StatusMin: tt.min, StatusMax: tt.max}}, nil)
		if r.OK != tt.ok || r.Code != tt.code {
			t.Errorf("%s in %d-%d: got ok=%v code=%d err=%q, want ok=%v code=%d", tt.path, tt.min, tt.max, r.OK, r.Code, r.Err, tt.ok, tt.code)
		}
		if !tt.ok && !strings.Contains(r.Err, "outside") {
			t.Errorf("%s: error %q does not name the status range", tt.path, r.Err)
		}
		if _, uri := srv.seen(); uri != tt.path {
			t.Errorf("server saw %q, want %q (redirect followed?)", uri, tt.path)
		}
	}
	if n := srv.requests.Load(); n != int64(len(tests)) {
		t.Errorf("server got %d requests for %d probes", n, len(tests))
	}
}

func TestHTTPProbeHostPathAndPort(t *testing.T) {
	srv := newStatusServer(t, 200)
	addr := srv.addr(t)
	// The backend's own port is closed; the probe port is the server's.
	tg := Target{
		Addr: netip.AddrPortFrom(addr.Addr(), 1),
		Spec: Spec{Kind: KindHTTP, Port: addr.Port(), Path: "/healthz?deep=1", Host: "svc.example"},
	}
	r := probeOnce(t, tg, nil)
	if !r.OK {
		t.Fatalf("probe failed: %s", r.Err)
	}
	host, uri := srv.seen()
	if host != "svc.example" || uri != "/healthz?deep=1" {
		t.Fatalf("server saw host %q uri %q", host, uri)
	}

	tg.Spec.Host = ""
	if r := probeOnce(t, tg, nil); !r.OK {
		t.Fatalf("probe without host failed: %s", r.Err)
	}
	if host, _ := srv.seen(); host != addr.String() {
		t.Fatalf("default host header %q, want the address %q", host, addr)
	}

	closed := Target{Addr: netip.AddrPortFrom(addr.Addr(), 1), Spec: Spec{Kind: KindHTTP}}
	if r := probeOnce(t, closed, nil); r.OK || !strings.Contains(r.Err, "refused") {
		t.Fatalf("probe of a closed port: ok=%v err=%q", r.OK, r.Err)
	}
}

func TestHTTPSProbe(t *testing.T) {
	var (
		mu  sync.Mutex
		sni []string
	)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Host != "example.com" && r.Host != localAddr(r) {
			w.WriteHeader(http.StatusMisdirectedRequest)
		}
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // rejected handshakes are expected
	srv.TLS = &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		mu.Lock()
		sni = append(sni, h.ServerName)
		mu.Unlock()
		return nil, nil
	}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	addr := addrPort(t, srv.Listener.Addr())
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())

	tests := []struct {
		name    string
		spec    Spec
		roots   *x509.CertPool
		ok      bool
		errLike string
		sni     string
	}{
		{"system roots reject a test certificate", Spec{Kind: KindHTTPS}, nil, false, "certificate", ""},
		{"skip verify", Spec{Kind: KindHTTPS, InsecureSkipVerify: true}, nil, true, "", ""},
		{"verified by address", Spec{Kind: KindHTTPS}, roots, true, "", ""},
		{"verified by host name, sent as SNI", Spec{Kind: KindHTTPS, Host: "example.com"}, roots, true, "", "example.com"},
		{"host with port: SNI is the name", Spec{Kind: KindHTTPS, Host: "example.com:8443"}, roots, false, "421", "example.com"},
		{"name not in certificate", Spec{Kind: KindHTTPS, Host: "wrong.test"}, roots, false, "certificate", "wrong.test"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mu.Lock()
			sni = nil
			mu.Unlock()
			r := probeOnce(t, Target{Addr: addr, Spec: tt.spec}, tt.roots)
			if r.OK != tt.ok || !strings.Contains(r.Err, tt.errLike) {
				t.Fatalf("got ok=%v err=%q, want ok=%v err containing %q", r.OK, r.Err, tt.ok, tt.errLike)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(sni) != 1 || sni[0] != tt.sni {
				t.Fatalf("server saw SNI %q, want one hello with %q", sni, tt.sni)
			}
		})
	}
}

// localAddr is the Host header a client sends when it has no name: the
// server's own address.
func localAddr(r *http.Request) string {
	return r.Context().Value(http.LocalAddrContextKey).(net.Addr).String()
}
