//go:build linux

package integration

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// dial connects from the client namespace, from a client port never used before.
func (tb *testbed) dial(network string, to netip.AddrPort) (net.Conn, error) {
	port := tb.nextClientPort()
	var conn net.Conn
	err := tb.clientNS.DoErr(func() error {
		d := net.Dialer{Timeout: 5 * time.Second}
		if strings.HasPrefix(network, "udp") {
			d.LocalAddr = &net.UDPAddr{Port: port}
		} else {
			d.LocalAddr = &net.TCPAddr{Port: port}
		}
		var err error
		conn, err = d.DialContext(context.Background(), network, to.String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s %s from port %d: %w", network, to, port, err)
	}
	return conn, nil
}

// httpDo sends one request over a fresh connection and hands the response to handle.
// It returns the client's side of the connection.
func (tb *testbed) httpDo(method string, to netip.AddrPort, path string, body io.Reader, size int64,
	timeout time.Duration, handle func(*http.Response) error) (netip.AddrPort, error) {
	conn, err := tb.dial("tcp", to)
	if err != nil {
		return netip.AddrPort{}, err
	}
	defer conn.Close()
	local := conn.LocalAddr().(*net.TCPAddr).AddrPort()
	conn.SetDeadline(time.Now().Add(timeout))
	req, err := http.NewRequest(method, "http://"+to.String()+path, body)
	if err != nil {
		return local, err
	}
	req.ContentLength = size
	req.Close = true
	if err := req.Write(conn); err != nil {
		return local, fmt.Errorf("%s %s from %v: send: %w", method, path, local, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return local, fmt.Errorf("%s %s from %v: read response: %w", method, path, local, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return local, fmt.Errorf("%s %s from %v: %s: %s", method, path, local, resp.Status, b)
	}
	if err := handle(resp); err != nil {
		return local, fmt.Errorf("%s %s from %v: %w", method, path, local, err)
	}
	return local, nil
}

// hello is what a backend answers to GET /.
type hello struct {
	backend string         // the node that answered
	seen    string         // the client address:port it saw
	local   netip.AddrPort // the client's side of the connection
}

// get sends GET / to a VIP from a fresh client port.
func (tb *testbed) get(to netip.AddrPort) (hello, error) {
	var h hello
	local, err := tb.httpDo(http.MethodGet, to, "/", nil, 0, 5*time.Second, func(r *http.Response) error {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return err
		}
		_, err = fmt.Sscanf(string(b), "be=%s client=%s", &h.backend, &h.seen)
		if err != nil {
			return fmt.Errorf("parse %q: %w", b, err)
		}
		return nil
	})
	h.local = local
	return h, err
}

// getMany sends n GET / requests, each from its own client port, a few at a time.
func (tb *testbed) getMany(t *testing.T, to netip.AddrPort, n int) []hello {
	t.Helper()
	out := make([]hello, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			out[i], errs[i] = tb.get(to)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("%d requests to %v: %v", n, to, err)
	}
	return out
}

// perBackend counts answers by backend.
func perBackend(hs []hello) map[string]int {
	m := map[string]int{}
	for _, h := range hs {
		m[h.backend]++
	}
	return m
}

// stream is a long-lived TCP connection through a VIP to the echo servers: every
// 10 ms it sends a 4 KB line and checks the echo, so data flows both ways the whole
// time. Any error (a reset, a 5 s stall, a wrong echo, a change of backend) ends it.
type stream struct {
	conn  net.Conn
	local netip.AddrPort
	stop  chan struct{}
	done  chan struct{}

	mu      sync.Mutex
	backend string
	n       int // echoes received
	err     error
}

const streamLine = 4000

func (tb *testbed) openStream(t *testing.T, to netip.AddrPort) *stream {
	t.Helper()
	conn, err := tb.dial("tcp", to)
	if err != nil {
		t.Fatal(err)
	}
	s := &stream{conn: conn, local: conn.LocalAddr().(*net.TCPAddr).AddrPort(),
		stop: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(s.close)
	r := bufio.NewReaderSize(conn, 64<<10)
	if err := s.exchange(r, 0); err != nil {
		t.Fatalf("stream from %v: first echo: %v", s.local, err)
	}
	go s.loop(r)
	return s
}

func (s *stream) exchange(r *bufio.Reader, seq int) error {
	line := fmt.Sprintf("%d %s\n", seq, strings.Repeat(string(rune('a'+seq%26)), streamLine))
	s.conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(s.conn, line); err != nil {
		return fmt.Errorf("send %d: %w", seq, err)
	}
	reply, err := r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("echo %d: %w", seq, err)
	}
	name, rest, ok := strings.Cut(reply, " ")
	if !ok || rest != line {
		return fmt.Errorf("echo %d: wrong reply of %d bytes", seq, len(reply))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.backend == "" {
		s.backend = name
	} else if name != s.backend {
		return fmt.Errorf("echo %d came from %s, the stream started on %s", seq, name, s.backend)
	}
	s.n++
	return nil
}

func (s *stream) loop(r *bufio.Reader) {
	defer close(s.done)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for seq := 1; ; seq++ {
		select {
		case <-s.stop:
			return
		case <-tick.C:
		}
		if err := s.exchange(r, seq); err != nil {
			select {
			case <-s.stop:
			default:
				s.mu.Lock()
				s.err = err
				s.mu.Unlock()
			}
			return
		}
	}
}

func (s *stream) close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
		s.conn.Close()
		<-s.done
	}
}

func (s *stream) state() (backend string, n int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.backend, s.n, s.err
}

// progress waits until the stream has exchanged n more echoes without error.
func (s *stream) progress(n int, timeout time.Duration) error {
	_, start, err := s.state()
	if err != nil {
		return fmt.Errorf("stream from %v: %w", s.local, err)
	}
	deadline := time.Now().Add(timeout)
	for {
		_, got, err := s.state()
		if err != nil {
			return fmt.Errorf("stream from %v after %d echoes: %w", s.local, got, err)
		}
		if got >= start+n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("stream from %v: %d echoes in %v, want %d", s.local, got-start, timeout, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// failed waits until the stream ends with an error and returns it, or nil if it is
// still healthy after timeout.
func (s *stream) failed(timeout time.Duration) error {
	select {
	case <-s.done:
	case <-time.After(timeout):
	}
	_, _, err := s.state()
	return err
}

// udpAnswer is what a backend answers to a datagram.
type udpAnswer struct {
	backend, seen, payload string
}

// ask sends payload on a connected UDP socket and waits for its answer, sending it
// again up to twice (datagrams may be lost while the datapath changes) and skipping
// late answers to earlier datagrams. A connected socket only accepts answers from the
// VIP:port it sent to.
func ask(c net.Conn, payload string) (udpAnswer, error) {
	buf := make([]byte, 2048)
	var last error
	for range 3 {
		if _, err := c.Write([]byte(payload)); err != nil {
			return udpAnswer{}, fmt.Errorf("send: %w", err)
		}
		c.SetDeadline(time.Now().Add(time.Second))
		for {
			n, err := c.Read(buf)
			if err != nil {
				last = err
				break
			}
			parts := strings.SplitN(string(buf[:n]), " ", 3)
			if len(parts) != 3 {
				return udpAnswer{}, fmt.Errorf("malformed answer %q", buf[:n])
			}
			if parts[2] == payload {
				return udpAnswer{backend: parts[0], seen: parts[1], payload: parts[2]}, nil
			}
		}
	}
	return udpAnswer{}, fmt.Errorf("no answer from %v to %v: %w", c.RemoteAddr(), c.LocalAddr(), last)
}
