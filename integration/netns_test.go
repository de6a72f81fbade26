//go:build linux

package integration

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/nsdo"
	"golang.org/x/sys/unix"
)

// run runs a command and returns its standard output, failing the test on error.
func run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := runErr(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// runErr runs a command and returns its standard output; the error carries stderr.
func runErr(args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// ipBatch runs ip commands (one per line, without the leading "ip") inside a namespace
// in a single process; ns "" is the test's own namespace.
func ipBatch(t *testing.T, ns string, lines ...string) {
	t.Helper()
	args := []string{"ip"}
	if ns != "" {
		args = append(args, "-n", ns)
	}
	cmd := exec.Command(args[0], append(args[1:], "-batch", "-")...)
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ip -n %s -batch: %v: %s\n%s", ns, err, out, strings.Join(lines, "\n"))
	}
}

// nsExec runs a command inside a namespace with `ip netns exec` (fine for tools that
// need no bpffs; daemons are started with nsenter, see daemon.start).
func nsExec(t *testing.T, ns string, args ...string) string {
	t.Helper()
	return run(t, append([]string{"ip", "netns", "exec", ns}, args...)...)
}

// inNS runs fn on an OS thread switched into the named network namespace. Sockets
// opened by fn stay in that namespace afterwards. A thread that cannot be switched
// back stays locked, so the runtime discards it.
func inNS(name string, fn func() error) error {
	return nsdo.RunNamed(name, fn)
}

// ifindex returns the index of an interface inside a namespace.
func ifindex(t *testing.T, ns, ifname string) int {
	t.Helper()
	var idx int
	err := inNS(ns, func() error {
		ifc, err := net.InterfaceByName(ifname)
		if err != nil {
			return fmt.Errorf("find %s in %s: %w", ifname, ns, err)
		}
		idx = ifc.Index
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return idx
}

// frame is one captured link-layer frame, cut to its headers.
type frame struct {
	data     []byte
	outgoing bool // sent by the interface rather than received
}

// capture records the frames an interface sends and receives, as AF_PACKET sees them:
// after XDP on receive, so frames that an XDP program consumed are not seen on the
// interface that ran it, but they are seen on its veth peer.
type capture struct {
	fd       int
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
	mu       sync.Mutex
	frames   []frame
}

// snapLen keeps the outer headers, the Geneve option and the inner headers.
const snapLen = 256

func startCapture(t *testing.T, ns, ifname string) *capture {
	t.Helper()
	idx := ifindex(t, ns, ifname)
	c := &capture{fd: -1, stop: make(chan struct{}), done: make(chan struct{})}
	err := inNS(ns, func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return fmt.Errorf("open packet socket: %w", err)
		}
		c.fd = fd
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: idx})
	})
	if err == nil {
		tv := unix.NsecToTimeval(int64(50 * time.Millisecond))
		err = errors.Join(unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv),
			unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20))
	}
	if err != nil {
		if c.fd >= 0 {
			unix.Close(c.fd)
		}
		t.Fatalf("capture on %s/%s: %v", ns, ifname, err)
	}
	go c.loop()
	t.Cleanup(func() { c.Stop() })
	return c
}

func (c *capture) loop() {
	defer close(c.done)
	buf := make([]byte, 65536)
	for {
		select {
		case <-c.stop:
			return
		default:
		}
		n, from, err := unix.Recvfrom(c.fd, buf, unix.MSG_TRUNC)
		if err != nil {
			continue
		}
		n = min(n, snapLen, len(buf))
		ll, _ := from.(*unix.SockaddrLinklayer)
		f := frame{data: append([]byte(nil), buf[:n]...), outgoing: ll != nil && ll.Pkttype == unix.PACKET_OUTGOING}
		c.mu.Lock()
		c.frames = append(c.frames, f)
		c.mu.Unlock()
	}
}

// Stop ends the capture and returns every frame seen; later calls return the same.
func (c *capture) Stop() []frame {
	c.stopOnce.Do(func() {
		close(c.stop)
		<-c.done
		unix.Close(c.fd)
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frames
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
