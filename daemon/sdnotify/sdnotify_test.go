package sdnotify

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// listener is the service manager's end of NOTIFY_SOCKET: a real datagram socket.
type listener struct {
	conn *net.UnixConn
	msgs chan string
}

func listen(t *testing.T) *listener {
	t.Helper()
	dir, err := os.MkdirTemp("", "sdnotify-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	l := &listener{conn: conn, msgs: make(chan string, 1000)}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				close(l.msgs)
				return
			}
			l.msgs <- string(buf[:n])
		}
	}()
	return l
}

// next returns the next message, or "" after timeout.
func (l *listener) next(timeout time.Duration) string {
	select {
	case m := <-l.msgs:
		return m
	case <-time.After(timeout):
		return ""
	}
}

// drain returns what arrived within d.
func (l *listener) drain(d time.Duration) []string {
	var out []string
	end := time.After(d)
	for {
		select {
		case m := <-l.msgs:
			out = append(out, m)
		case <-end:
			return out
		}
	}
}

func count(msgs []string, prefix string) int {
	n := 0
	for _, m := range msgs {
		for _, line := range strings.Split(m, "\n") {
			if strings.HasPrefix(line, prefix) {
				n++
			}
		}
	}
	return n
}

func newNotifier(t *testing.T) *Notifier {
	t.Helper()
	n, err := New(hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestReadyOnlyWhenReady: no READY=1 while readiness says no, whatever the time; exactly
// one once it says yes, then STATUS= lines follow readiness; STOPPING=1 at the end.
func TestReadyOnlyWhenReady(t *testing.T) {
	l := listen(t)
	t.Setenv("WATCHDOG_USEC", "")
	var ready atomic.Bool
	reason := atomic.Pointer[string]{}
	setReason := func(s string) { reason.Store(&s) }
	setReason("the maps are being brought in line with the desired state")
	n := newNotifier(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.Run(ctx, func() (bool, string) { return ready.Load(), *reason.Load() }, nil)
	}()

	first := l.drain(time.Second)
	if count(first, "READY=1") != 0 {
		t.Fatalf("READY=1 sent while not ready: %q", first)
	}
	if count(first, "STATUS=starting: the maps are being brought in line") != 1 {
		t.Errorf("want one STATUS=starting with the reason, got %q", first)
	}

	setReason("datapath attached and in line with the desired state")
	ready.Store(true)
	got := l.next(time.Second)
	if got != "READY=1\nSTATUS=ready: datapath attached and in line with the desired state" {
		t.Fatalf("after readiness: %q, want READY=1 with the status", got)
	}

	setReason("the datapath is detached (lbctl node detach)")
	ready.Store(false)
	got = l.next(2 * time.Second)
	if got != "STATUS=not ready: the datapath is detached (lbctl node detach)" {
		t.Fatalf("after losing readiness: %q, want a not-ready STATUS", got)
	}
	ready.Store(true)
	setReason("datapath attached and in line with the desired state")
	rest := l.drain(1500 * time.Millisecond)
	if count(rest, "READY=1") != 0 || count(rest, "STATUS=ready:") != 1 {
		t.Errorf("ready again: %q, want one STATUS=ready and no second READY=1", rest)
	}

	cancel()
	<-done
	if got := l.next(time.Second); got != "STOPPING=1\nSTATUS=stopping" {
		t.Errorf("at shutdown: %q, want STOPPING=1", got)
	}
}

// TestWatchdogFollowsAlive: WATCHDOG=1 every half timeout while alive answers, none while
// it fails or hangs past its deadline, and again once it answers.
func TestWatchdogFollowsAlive(t *testing.T) {
	l := listen(t)
	const timeout = 400 * time.Millisecond
	t.Setenv("WATCHDOG_USEC", "400000")
	t.Setenv("WATCHDOG_PID", "")
	n := newNotifier(t)
	if n.Watchdog() != timeout {
		t.Fatalf("watchdog %v, want %v from WATCHDOG_USEC", n.Watchdog(), timeout)
	}
	var mode atomic.Int32 // 0 answers, 1 fails, 2 hangs until its deadline
	var deadlineSeen atomic.Bool
	alive := func(ctx context.Context) error {
		switch mode.Load() {
		case 1:
			return errors.New("the reconciler does not answer")
		case 2:
			<-ctx.Done()
			if d, ok := ctx.Deadline(); ok && time.Until(d) <= 0 {
				deadlineSeen.Store(true)
			}
			return ctx.Err()
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go n.Run(ctx, func() (bool, string) { return true, "ready" }, alive)

	// Over 1.1 s at one ping per 200 ms: 5 or 6, and READY=1 once.
	msgs := l.drain(1100 * time.Millisecond)
	if c := count(msgs, "WATCHDOG=1"); c < 4 || c > 7 {
		t.Errorf("%d WATCHDOG=1 in 1.1 s with a 400 ms timeout, want about 6: %q", c, msgs)
	}
	for _, m := range []int32{1, 2} {
		mode.Store(m)
		l.drain(300 * time.Millisecond) // a check already under way may still answer
		if msgs := l.drain(time.Second); count(msgs, "WATCHDOG=1") != 0 {
			t.Errorf("mode %d: WATCHDOG=1 sent while the daemon does not answer: %q", m, msgs)
		}
	}
	if !deadlineSeen.Load() {
		t.Error("a hanging check was not given a deadline")
	}
	mode.Store(0)
	if msgs := l.drain(time.Second); count(msgs, "WATCHDOG=1") == 0 {
		t.Error("no WATCHDOG=1 after the daemon answers again")
	}
}

// TestWatchdogOfAnotherProcess: WATCHDOG_PID naming another process (inherited from a
// parent) turns the watchdog off.
func TestWatchdogOfAnotherProcess(t *testing.T) {
	t.Setenv("WATCHDOG_USEC", "400000")
	t.Setenv("WATCHDOG_PID", "1")
	if n := newNotifier(t); n.Watchdog() != 0 {
		t.Errorf("watchdog %v for WATCHDOG_PID=1, want off", n.Watchdog())
	}
}

// TestNoNotifySocket: outside systemd nothing is sent and nothing fails.
func TestNoNotifySocket(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	t.Setenv("WATCHDOG_USEC", "")
	if newNotifier(t).notify("READY=1") {
		t.Error("READY=1 reported as sent without a NOTIFY_SOCKET")
	}
}

// TestBadWatchdog: a WATCHDOG_USEC that is no number is an error naming it.
func TestBadWatchdog(t *testing.T) {
	t.Setenv("WATCHDOG_USEC", "soon")
	if _, err := New(hclog.NewNullLogger()); err == nil || !strings.Contains(err.Error(), "WATCHDOG_USEC") {
		t.Errorf("New with WATCHDOG_USEC=soon: %v, want an error naming WATCHDOG_USEC", err)
	}
}
