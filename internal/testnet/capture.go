//go:build linux

package testnet

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// PacketSocket opens an AF_PACKET socket in the namespace that sends and receives whole
// link-layer frames on dev (every interface of the namespace if dev is ""), as the
// interface sees them: after XDP on receive, so a frame that an XDP program consumed is
// not seen on the interface that ran it, only on its veth peer. Reads time out after
// 50 ms, so that a reader can check its own deadline. It is closed at cleanup.
func (ns *NS) PacketSocket(tb testing.TB, dev string) int {
	tb.Helper()
	fd := ns.packetSocket(tb, dev)
	tb.Cleanup(func() { unix.Close(fd) })
	return fd
}

// packetSocket is PacketSocket without the cleanup, for a Capture that closes its
// socket when stopped.
func (ns *NS) packetSocket(tb testing.TB, dev string) int {
	tb.Helper()
	idx := 0
	if dev != "" {
		idx = ns.Interface(tb, dev).Index
	}
	fd := -1
	err := ns.DoErr(func() error {
		var err error
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL))); err != nil {
			return fmt.Errorf("open packet socket: %w", err)
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: idx})
	})
	if err == nil {
		tv := unix.NsecToTimeval(int64(50 * time.Millisecond))
		// A large buffer: a capture must not lose the frames of a burst.
		err = errors.Join(unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv),
			unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20))
	}
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		tb.Fatalf("packet socket on %s/%s: %v", ns.Name, dev, err)
	}
	return fd
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// SnapLen is how much of each frame a Capture keeps: the outer headers, a Geneve option
// and the inner headers.
const SnapLen = 256

// Frame is one captured link-layer frame, cut to SnapLen. Loopback frames carry an
// all-zero Ethernet header, so every frame decodes as Ethernet.
type Frame struct {
	Data []byte
	// Outgoing is true for a frame the interface sent rather than received.
	Outgoing bool
}

// Capture records the frames of a PacketSocket in the background until Stop.
type Capture struct {
	fd       int
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
	mu       sync.Mutex
	frames   []Frame
}

// Capture starts capturing on dev ("" for every interface of the namespace). It is
// stopped at cleanup if the test did not stop it.
func (ns *NS) Capture(tb testing.TB, dev string) *Capture {
	tb.Helper()
	c := &Capture{fd: ns.packetSocket(tb, dev), stop: make(chan struct{}), done: make(chan struct{})}
	go c.loop()
	tb.Cleanup(func() { c.Stop() })
	return c
}

func (c *Capture) loop() {
	defer close(c.done)
	buf := make([]byte, 65536)
	var drainUntil time.Time // set once stopped
	for {
		if drainUntil.IsZero() {
			select {
			case <-c.stop:
				// Frames a test already saw the effect of are queued on the socket,
				// perhaps not read yet: read what is queued, then end.
				drainUntil = time.Now().Add(time.Second)
			default:
			}
		}
		flags := unix.MSG_TRUNC
		if !drainUntil.IsZero() {
			flags |= unix.MSG_DONTWAIT
		}
		n, from, err := unix.Recvfrom(c.fd, buf, flags)
		if err != nil {
			if !drainUntil.IsZero() {
				return
			}
			continue // the 50 ms timeout: look at c.stop again
		}
		n = min(n, SnapLen, len(buf))
		ll, _ := from.(*unix.SockaddrLinklayer)
		f := Frame{Data: append([]byte(nil), buf[:n]...), Outgoing: ll != nil && ll.Pkttype == unix.PACKET_OUTGOING}
		c.mu.Lock()
		c.frames = append(c.frames, f)
		c.mu.Unlock()
		if !drainUntil.IsZero() && time.Now().After(drainUntil) {
			return
		}
	}
}

// Frames returns the frames seen so far; the capture goes on.
func (c *Capture) Frames() []Frame {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.frames)
}

// Stop ends the capture once the frames queued so far are read, and returns every
// frame seen; later calls return the same.
func (c *Capture) Stop() []Frame {
	c.stopOnce.Do(func() {
		close(c.stop)
		<-c.done
		unix.Close(c.fd)
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frames
}
