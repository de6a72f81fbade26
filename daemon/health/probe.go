package health

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"time"
)

// Result is the outcome of one probe.
type Result struct {
	// At is when the probe started.
	At time.Time
	// OK is true when the probe passed.
	OK bool
	// Err says why it failed; empty when OK.
	Err string
	// Latency is the time the probe took.
	Latency time.Duration
	// Code is the HTTP status code, 0 for TCP or when no response came.
	Code int
}

// prober runs one kind of probe against one address. Implementations are
// built once per target so a probe allocates little.
type prober interface {
	probe(ctx context.Context) (code int, err error)
}

func newProber(t Target, roots *x509.CertPool) (prober, error) {
	switch t.Spec.Kind {
	case KindTCP:
		return tcpProber{addr: t.probeAddr().String()}, nil
	case KindHTTP, KindHTTPS:
		return newHTTPProber(t.Spec, t.probeAddr(), roots)
	}
	return nil, fmt.Errorf("no prober for kind %v", t.Spec.Kind)
}

// runProbe runs p with the spec's timeout and turns its outcome into a Result.
func runProbe(ctx context.Context, p prober, timeout time.Duration) Result {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	code, err := p.probe(ctx)
	r := Result{At: start, Latency: time.Since(start), Code: code, OK: err == nil}
	if err != nil {
		// The raw errors of a timed-out probe vary by stage ("i/o timeout",
		// "context deadline exceeded", "TLS handshake timeout"); operators
		// need one clear message.
		if ctx.Err() == context.DeadlineExceeded || errors.Is(err, os.ErrDeadlineExceeded) {
			r.Err = fmt.Sprintf("timed out after %v: %v", timeout, err)
		} else {
			r.Err = err.Error()
		}
	}
	return r
}

type tcpProber struct{ addr string }

func (p tcpProber) probe(ctx context.Context) (int, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return 0, err
	}
	// Close with RST: a graceful close would leave the prober one TIME_WAIT
	// socket per probe for a minute (60,000 for 1,000 targets at 1 s).
	// HAProxy's TCP checks do the same.
	if tc, ok := c.(*net.TCPConn); ok {
		if err := tc.SetLinger(0); err != nil {
			c.Close()
			return 0, fmt.Errorf("set linger: %w", err)
		}
	}
	return 0, c.Close()
}

// maxResponseHead bounds what an HTTP probe reads: the status line and
// headers are all it needs, and a broken backend must not make it buffer more.
const maxResponseHead = 64 << 10

// httpProber speaks just enough HTTP/1.1 itself (one request per connection)
// rather than using http.Transport: Transport finishes dials and TLS
// handshakes in background goroutines after the request gives up, so a hung
// backend would leak a goroutine and a socket per probe. Here every step runs
// in the probe's goroutine under its deadline.
type httpProber struct {
	addr     string
	tls      *tls.Config // nil for plain HTTP
	request  []byte
	min, max int
}

func newHTTPProber(s Spec, addr netip.AddrPort, roots *x509.CertPool) (*httpProber, error) {
	scheme := "http"
	p := &httpProber{addr: addr.String(), min: s.StatusMin, max: s.StatusMax}
	if s.Kind == KindHTTPS {
		scheme = "https"
		// Verify against the host name when there is one, else against the
		// address (an IP is never sent as SNI).
		serverName := addr.Addr().String()
		if s.Host != "" {
			serverName = s.Host
			if h, _, err := net.SplitHostPort(s.Host); err == nil {
				serverName = h
			}
		}
		p.tls = &tls.Config{
			ServerName: serverName,
			RootCAs:    roots,
			MinVersion: tls.VersionTLS12,
			// Opt-in per service, for backends with self-signed certificates.
			InsecureSkipVerify: s.InsecureSkipVerify,
		}
	}
	req, err := http.NewRequest(http.MethodGet, scheme+"://"+p.addr+s.Path, nil)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	if s.Host != "" {
		req.Host = s.Host
	}
	req.Close = true
	req.Header.Set("User-Agent", "lbd-health-check")
	var b bytes.Buffer
	if err := req.Write(&b); err != nil {
		return nil, fmt.Errorf("render request: %w", err)
	}
	p.request = b.Bytes()
	return p, nil
}

func (p *httpProber) probe(ctx context.Context) (int, error) {
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return 0, err
	}
	// RST on close, as for TCP probes: no TIME_WAIT per probe on our side.
	if err := raw.(*net.TCPConn).SetLinger(0); err != nil {
		raw.Close()
		return 0, fmt.Errorf("set linger: %w", err)
	}
	defer raw.Close()
	// Reads and writes obey deadlines, not contexts: cut them short when the
	// probe times out or its runner is stopped.
	stop := context.AfterFunc(ctx, func() { raw.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if dl, ok := ctx.Deadline(); ok {
		raw.SetDeadline(dl)
	}
	conn := raw
	if p.tls != nil {
		tc := tls.Client(raw, p.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			return 0, fmt.Errorf("tls handshake with %s: %w", p.addr, err)
		}
		conn = tc
	}
	if _, err := conn.Write(p.request); err != nil {
		return 0, fmt.Errorf("send request to %s: %w", p.addr, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(io.LimitReader(conn, maxResponseHead)), nil)
	if err != nil {
		return 0, fmt.Errorf("read response from %s: %w", p.addr, err)
	}
	resp.Body.Close()
	if resp.StatusCode < p.min || resp.StatusCode > p.max {
		return resp.StatusCode, fmt.Errorf("status %d outside %d-%d", resp.StatusCode, p.min, p.max)
	}
	return resp.StatusCode, nil
}
