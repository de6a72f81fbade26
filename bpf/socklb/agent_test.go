//go:build linux

package socklb

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The client side of the root tests runs in a separate process (the test binary
// re-executed with agentEnv set), because cgroup membership belongs to a process: the
// test process itself stays outside the test's cgroup. The agent reads one JSON
// request per line on stdin and answers one JSON line on stdout. It makes its sockets
// with raw system calls so that the tests see connect()'s errno and duration,
// getpeername() and recvfrom()'s source exactly as an application would.
const agentEnv = "LBD_SOCKLB_TEST_AGENT"

// agentReq is one request to the agent.
type agentReq struct {
	// Op is "tcp" (connect N times), "send" (a line on a held connection), "close"
	// (a held connection), "udp" (one socket, N datagrams) or "bench" (N connect+close).
	Op string
	// Addr is the destination. Mapped sends an IPv4 destination from an AF_INET6
	// socket as ::ffff:a.b.c.d (a dual-stack socket).
	Addr   string
	Mapped bool
	N      int
	// Timeout bounds each connect and each read.
	Timeout time.Duration
	// Send is written after connecting (TCP) or as each datagram (UDP). The reply is
	// one line, or everything up to EOF with ReadAll.
	Send    string
	ReadAll bool
	// Hold keeps a TCP connection open under an ID (tcp), or names one (send, close).
	Hold bool
	ID   int
	// Connected makes "udp" connect() its socket and use send()/recvfrom().
	Connected bool
	// Blocking makes "tcp" use a blocking connect() (bounded by SO_SNDTIMEO): a
	// failed one leaves the socket disconnected, unlike a failed non-blocking one.
	Blocking bool
	// Reconnect makes a connected "udp" socket connect() again to this address
	// after its N datagrams, and exchange one more.
	Reconnect string
}

// agentResult is the outcome of one connect or one datagram.
type agentResult struct {
	// Errno is the failed call's errno (0: success); Err says which call failed.
	Errno int
	Err   string
	// Dur is how long connect() took (TCP, connected UDP).
	Dur time.Duration
	// Peer is getpeername() (TCP, connected UDP); From is recvfrom()'s source (UDP).
	Peer, From string
	Cookie     uint64
	Reply      string
	ID         int
}

// agentResp answers one agentReq.
type agentResp struct {
	Results []agentResult
	Err     string
	// Total is the time the "bench" loop took.
	Total time.Duration
}

// runAgent serves requests until stdin closes.
func runAgent() {
	a := &agentState{held: map[int]*heldConn{}}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req agentReq
		var resp agentResp
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			resp.Err = err.Error()
		} else {
			resp = a.serve(req)
		}
		if err := out.Encode(resp); err != nil {
			fmt.Fprintln(os.Stderr, "agent:", err)
			os.Exit(1)
		}
	}
}

type heldConn struct {
	conn net.Conn
	rd   *bufio.Reader
}

type agentState struct {
	held   map[int]*heldConn
	nextID int
}

func (a *agentState) serve(req agentReq) agentResp {
	if req.Timeout == 0 {
		req.Timeout = 2 * time.Second
	}
	var resp agentResp
	switch req.Op {
	case "tcp":
		for range max(req.N, 1) {
			resp.Results = append(resp.Results, a.tcp(req))
		}
	case "send":
		h, ok := a.held[req.ID]
		if !ok {
			resp.Err = fmt.Sprintf("no held connection %d", req.ID)
			break
		}
		r := agentResult{ID: req.ID}
		_ = h.conn.SetDeadline(time.Now().Add(req.Timeout))
		if _, err := io.WriteString(h.conn, req.Send); err != nil {
			r.Err = "write: " + err.Error()
		} else if line, err := h.rd.ReadString('\n'); err != nil {
			r.Err = "read: " + err.Error()
		} else {
			r.Reply = line
		}
		resp.Results = append(resp.Results, r)
	case "close":
		if h, ok := a.held[req.ID]; ok {
			h.conn.Close()
			delete(a.held, req.ID)
		}
	case "udp":
		resp.Results = udpExchange(req)
	case "bench":
		total, err := benchConnects(req)
		resp.Total = total
		if err != nil {
			resp.Err = err.Error()
		}
	default:
		resp.Err = "unknown op " + req.Op
	}
	return resp
}

// sockaddr converts a destination for a socket of the family it returns.
func sockaddr(s string, mapped bool) (int, unix.Sockaddr, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return 0, nil, err
	}
	if ap.Addr().Is4() && !mapped {
		return unix.AF_INET, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}, nil
	}
	return unix.AF_INET6, &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}, nil
}

// sockaddrString prints a socket address the way the tests compare them: an
// IPv4-mapped IPv6 address keeps its ::ffff: form.
func sockaddrString(sa unix.Sockaddr) string {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port)).String()
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port)).String()
	}
	return fmt.Sprintf("%T", sa)
}

func errnoOf(err error) int {
	var en unix.Errno
	if errors.As(err, &en) {
		return int(en)
	}
	return -1
}

// connectFD connects a new socket of the given type, non-blocking with poll() so that
// a signal cannot cut the wait short; it returns the fd (blocking again) and how long
// connect() took until the connection was established or failed.
func connectFD(typ int, req agentReq) (int, time.Duration, agentResult) {
	var r agentResult
	fam, sa, err := sockaddr(req.Addr, req.Mapped)
	if err != nil {
		r.Err, r.Errno = err.Error(), -1
		return -1, 0, r
	}
	flags := unix.SOCK_CLOEXEC
	if !req.Blocking {
		flags |= unix.SOCK_NONBLOCK
	}
	fd, err := unix.Socket(fam, typ|flags, 0)
	if err != nil {
		r.Err, r.Errno = "socket: "+err.Error(), errnoOf(err)
		return -1, 0, r
	}
	if req.Blocking {
		tv := unix.NsecToTimeval(req.Timeout.Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
			unix.Close(fd)
			r.Err, r.Errno = "SO_SNDTIMEO: "+err.Error(), errnoOf(err)
			return -1, 0, r
		}
	}
	start := time.Now()
	err = unix.Connect(fd, sa)
	if errors.Is(err, unix.EINPROGRESS) || errors.Is(err, unix.EINTR) {
		err = waitConnected(fd, start.Add(req.Timeout))
	}
	dur := time.Since(start)
	if err != nil {
		unix.Close(fd)
		r.Err, r.Errno, r.Dur = "connect: "+err.Error(), errnoOf(err), dur
		return -1, dur, r
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		r.Err, r.Errno = "set blocking: "+err.Error(), errnoOf(err)
		return -1, dur, r
	}
	r.Dur = dur
	return fd, dur, r
}

func waitConnected(fd int, deadline time.Time) error {
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return unix.ETIMEDOUT
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, err := unix.Poll(pfd, int(left/time.Millisecond)+1)
		if errors.Is(err, unix.EINTR) || (err == nil && n == 0) {
			continue
		}
		if err != nil {
			return err
		}
		soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return err
		}
		if soErr != 0 {
			return unix.Errno(soErr)
		}
		return nil
	}
}

func (a *agentState) tcp(req agentReq) agentResult {
	fd, _, r := connectFD(unix.SOCK_STREAM, req)
	if fd < 0 {
		return r
	}
	if sa, err := unix.Getpeername(fd); err == nil {
		r.Peer = sockaddrString(sa)
	} else {
		r.Err = "getpeername: " + err.Error()
	}
	r.Cookie, _ = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
	// The Go runtime does the reading: it copes with signals and deadlines.
	f := os.NewFile(uintptr(fd), "conn")
	conn, err := net.FileConn(f)
	f.Close()
	if err != nil {
		r.Err = "file conn: " + err.Error()
		return r
	}
	rd := bufio.NewReader(conn)
	if req.Send != "" {
		_ = conn.SetDeadline(time.Now().Add(req.Timeout))
		if _, err := io.WriteString(conn, req.Send); err != nil {
			r.Err = "write: " + err.Error()
		} else if req.ReadAll {
			b, err := io.ReadAll(rd)
			r.Reply = string(b)
			if err != nil {
				r.Err = "read: " + err.Error()
			}
		} else if line, err := rd.ReadString('\n'); err != nil {
			r.Err = "read: " + err.Error()
		} else {
			r.Reply = line
		}
	}
	if req.Hold {
		a.nextID++
		r.ID = a.nextID
		_ = conn.SetDeadline(time.Time{})
		a.held[r.ID] = &heldConn{conn: conn, rd: rd}
		return r
	}
	conn.Close()
	return r
}

// udpExchange sends req.N datagrams from one socket and reads one reply to each.
func udpExchange(req agentReq) []agentResult {
	var out []agentResult
	fam, sa, err := sockaddr(req.Addr, req.Mapped)
	if err != nil {
		return []agentResult{{Errno: -1, Err: err.Error()}}
	}
	var fd int
	var peer string
	if req.Connected {
		var r agentResult
		if fd, _, r = connectFD(unix.SOCK_DGRAM, req); fd < 0 {
			return []agentResult{r}
		}
		if p, err := unix.Getpeername(fd); err == nil {
			peer = sockaddrString(p)
		}
	} else if fd, err = unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err != nil {
		return []agentResult{{Errno: errnoOf(err), Err: "socket: " + err.Error()}}
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval(req.Timeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return []agentResult{{Errno: errnoOf(err), Err: "SO_RCVTIMEO: " + err.Error()}}
	}
	n := max(req.N, 1)
	for i := range n + 1 {
		if i == n {
			if req.Reconnect == "" {
				break
			}
			_, sa2, err := sockaddr(req.Reconnect, req.Mapped)
			if err == nil {
				err = unix.Connect(fd, sa2)
			}
			if err != nil {
				return append(out, agentResult{Errno: errnoOf(err), Err: "connect again: " + err.Error()})
			}
			if p, err := unix.Getpeername(fd); err == nil {
				peer = sockaddrString(p)
			}
		}
		r := agentResult{Peer: peer}
		r.Cookie, _ = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
		if req.Connected {
			_, err = unix.Write(fd, []byte(req.Send))
		} else {
			err = unix.Sendto(fd, []byte(req.Send), 0, sa)
		}
		if err != nil {
			r.Errno, r.Err = errnoOf(err), "send: "+err.Error()
			out = append(out, r)
			continue
		}
		buf := make([]byte, 1500)
		for {
			var n int
			var from unix.Sockaddr
			n, from, err = unix.Recvfrom(fd, buf, 0)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err == nil {
				r.Reply, r.From = string(buf[:n]), sockaddrString(from)
			}
			break
		}
		if err != nil {
			r.Errno, r.Err = errnoOf(err), "recvfrom: "+err.Error()
		}
		out = append(out, r)
	}
	return out
}

// benchConnects connects and closes req.N TCP connections, one after the other. The
// close resets the connection (SO_LINGER 0), so that no TIME_WAIT entries pile up and
// exhaust the ephemeral ports.
func benchConnects(req agentReq) (time.Duration, error) {
	fam, sa, err := sockaddr(req.Addr, req.Mapped)
	if err != nil {
		return 0, err
	}
	linger := unix.Linger{Onoff: 1, Linger: 0}
	start := time.Now()
	for i := range req.N {
		fd, err := unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return 0, fmt.Errorf("socket: %w", err)
		}
		for err = unix.Connect(fd, sa); errors.Is(err, unix.EINTR); {
			// An interrupted blocking connect goes on in the background.
			err = waitConnected(fd, time.Now().Add(req.Timeout))
		}
		if err != nil {
			unix.Close(fd)
			return 0, fmt.Errorf("connect %d of %d: %w", i+1, req.N, err)
		}
		if err := unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &linger); err != nil {
			unix.Close(fd)
			return 0, fmt.Errorf("SO_LINGER: %w", err)
		}
		unix.Close(fd)
	}
	return time.Since(start), nil
}

// replyName extracts the backend name from an HTTP response or a reply line.
func replyName(s string) string {
	if i := strings.Index(s, "\r\n\r\n"); i >= 0 {
		s = s[i+4:]
	}
	return strings.TrimSpace(s)
}
