//go:build linux

package integration

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"
)

// Ports the backend servers listen on (every address of their node).
const (
	httpPort = 8080 // HTTP: "/", "/bytes?n=N", "/upload"
	echoPort = 9000 // TCP: answers each line with "<node> <line>"
	udpPort  = 9001 // UDP: answers each datagram with "<node> <client addr:port> <payload>"
)

// serve runs the servers of one backend node until killed. It prints "ready" once every
// listener is open. Each answer names the node and the client address it saw, which is
// how the tests learn where a flow went and that the client address survived.
func serve(name string) int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 1
	}
	hl, err := net.Listen("tcp", fmt.Sprintf(":%d", httpPort))
	if err != nil {
		return fail(err)
	}
	el, err := net.Listen("tcp", fmt.Sprintf(":%d", echoPort))
	if err != nil {
		return fail(err)
	}
	uc, err := net.ListenPacket("udp", fmt.Sprintf(":%d", udpPort))
	if err != nil {
		return fail(err)
	}
	var keepalive time.Duration
	if s := os.Getenv(keepaliveEnv); s != "" {
		if keepalive, err = time.ParseDuration(s); err != nil {
			return fail(err)
		}
	}
	errc := make(chan error, 3)
	go func() { errc <- http.Serve(hl, httpHandler(name)) }()
	go func() { errc <- serveEcho(name, el, keepalive) }()
	go func() { errc <- serveUDP(name, uc) }()
	fmt.Println("ready")
	return fail(<-errc)
}

func httpHandler(name string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "be=%s client=%s\n", name, r.RemoteAddr)
	})
	mux.HandleFunc("GET /bytes", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		if err != nil || n < 0 {
			http.Error(w, "bad n", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		w.Header().Set("X-Backend", name)
		io.Copy(w, &patternReader{n: n})
	})
	mux.HandleFunc("POST /upload", func(w http.ResponseWriter, r *http.Request) {
		n, err := checkPattern(r.Body)
		if err != nil {
			http.Error(w, fmt.Sprintf("be=%s n=%d: %v", name, n, err), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "be=%s n=%d\n", name, n)
	})
	return mux
}

// keepaliveEnv, when set, is how often the echo server probes an idle connection
// (TCP keepalive): the probes leave the backend node through its SNAT, like any reply.
const keepaliveEnv = "LBD_IT_KEEPALIVE"

func serveEcho(name string, l net.Listener, keepalive time.Duration) error {
	for {
		c, err := l.Accept()
		if err != nil {
			return fmt.Errorf("accept: %w", err)
		}
		if keepalive > 0 {
			c.(*net.TCPConn).SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: keepalive, Interval: keepalive, Count: 3})
		}
		go func() {
			defer c.Close()
			r := bufio.NewReaderSize(c, 64<<10)
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				if _, err := io.WriteString(c, name+" "+line); err != nil {
					return
				}
			}
		}()
	}
}

func serveUDP(name string, c net.PacketConn) error {
	buf := make([]byte, 64<<10)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
		reply := fmt.Appendf(nil, "%s %s %s", name, from, buf[:n])
		if _, err := c.WriteTo(reply, from); err != nil {
			return fmt.Errorf("write: %w", err)
		}
	}
}

// patternAt is the byte at offset i of every transfer. Its period (2^32) is far
// longer than any transfer, so a lost, duplicated or reordered segment shows up.
func patternAt(i int64) byte {
	return byte(i ^ i>>7 ^ i>>15 ^ i>>23)
}

// patternReader yields the first n bytes of the pattern.
type patternReader struct {
	off, n int64
}

func (p *patternReader) Read(b []byte) (int, error) {
	if p.off >= p.n {
		return 0, io.EOF
	}
	if rest := p.n - p.off; int64(len(b)) > rest {
		b = b[:rest]
	}
	for i := range b {
		b[i] = patternAt(p.off + int64(i))
	}
	p.off += int64(len(b))
	return len(b), nil
}

// checkPattern reads r to the end and returns how many bytes it held, failing at the
// first byte that differs from the pattern.
func checkPattern(r io.Reader) (int64, error) {
	buf := make([]byte, 64<<10)
	var off int64
	for {
		n, err := r.Read(buf)
		for i := range n {
			if buf[i] != patternAt(off+int64(i)) {
				return off + int64(i), fmt.Errorf("byte %d differs from the pattern", off+int64(i))
			}
		}
		off += int64(n)
		if errors.Is(err, io.EOF) {
			return off, nil
		}
		if err != nil {
			return off, err
		}
	}
}
