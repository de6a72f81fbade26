// Package peercred identifies the process at the other end of the API's Unix socket by
// what the kernel recorded when it connected: its uid, primary gid (SO_PEERCRED) and
// supplementary groups (SO_PEERGROUPS). The peer cannot choose or change them.
package peercred

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Creds are a socket peer's credentials as they were at connect().
type Creds struct {
	PID int32
	UID uint32
	// GIDs holds the primary group first, then the supplementary groups.
	GIDs []uint32
}

// Read returns the credentials of c's peer.
func Read(c syscall.Conn) (Creds, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return Creds{}, fmt.Errorf("peer credentials: %w", err)
	}
	var cr Creds
	var rerr error
	err = raw.Control(func(fd uintptr) {
		u, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if err != nil {
			rerr = fmt.Errorf("SO_PEERCRED: %w", err)
			return
		}
		cr = Creds{PID: u.Pid, UID: u.Uid, GIDs: []uint32{u.Gid}}
		groups, err := peerGroups(int(fd))
		if err != nil {
			rerr = fmt.Errorf("SO_PEERGROUPS: %w", err)
			return
		}
		for _, g := range groups {
			if g != u.Gid {
				cr.GIDs = append(cr.GIDs, g)
			}
		}
	})
	if err != nil {
		return Creds{}, fmt.Errorf("peer credentials: %w", err)
	}
	return cr, rerr
}

// peerGroups reads SO_PEERGROUPS (Linux 4.13), which x/sys/unix has no helper for. The
// kernel answers ERANGE with the size it needs when the buffer is too small.
func peerGroups(fd int) ([]uint32, error) {
	buf := make([]uint32, 32)
	for {
		n := uint32(len(buf) * 4)
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
		switch {
		case errno == unix.ERANGE && int(n/4) > len(buf):
			buf = make([]uint32, n/4)
		case errno != 0:
			return nil, errno
		default:
			return buf[:n/4], nil
		}
	}
}

// Conn is an accepted connection with its peer's credentials.
type Conn struct {
	*net.UnixConn
	Creds Creds
	local net.Addr
}

// LocalAddr is the socket's path written as host and port ("[path]:0"): consumers that
// split a local address into host and port (gRPC's authorization engine reads the
// destination port) accept it, and a Unix socket has no port.
func (c *Conn) LocalAddr() net.Addr { return c.local }

type socketAddr string

func (a socketAddr) Network() string { return "unix" }
func (a socketAddr) String() string  { return "[" + string(a) + "]:0" }

// Listener accepts Unix connections and reads each peer's credentials as it accepts it.
type Listener struct {
	*net.UnixListener
	local socketAddr
}

// NewListener wraps ln.
func NewListener(ln *net.UnixListener) *Listener {
	return &Listener{UnixListener: ln, local: socketAddr(ln.Addr().String())}
}

// Accept returns the next connection whose peer's credentials could be read; one whose
// could not (the peer already gone) is closed and skipped, since an error here would
// end the server's accept loop.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return nil, err
		}
		cr, err := Read(c)
		if err != nil {
			c.Close()
			continue
		}
		return &Conn{UnixConn: c, Creds: cr, local: l.local}, nil
	}
}

// ErrNotPeerConn is returned by the transport credentials for a connection that did not
// come from a Listener.
var ErrNotPeerConn = errors.New("connection carries no peer credentials (not accepted by peercred.Listener)")
