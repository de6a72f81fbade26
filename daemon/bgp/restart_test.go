package bgp

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/bgptest"
)

// Environment of the speaker child process (the test binary run again).
const (
	childEnv           = "LBD_BGP_TEST_CHILD"
	childPortEnv       = "LBD_BGP_TEST_CHILD_PORT"
	childRestartingEnv = "LBD_BGP_TEST_CHILD_RESTARTING"
	childRoutesEnv     = "LBD_BGP_TEST_CHILD_ROUTES"
)

// TestSpeakerChildProcess is not a test: it is the body of the speaker child
// process of TestGracefulRestartKeepsRoutes, which kills it to play a daemon
// crash. It advertises the routes it is given and waits.
func TestSpeakerChildProcess(t *testing.T) {
	if os.Getenv(childEnv) != "1" {
		t.Skip("runs only as the child of TestGracefulRestartKeepsRoutes")
	}
	port, err := strconv.Atoi(os.Getenv(childPortEnv))
	if err != nil {
		t.Fatalf("child: port: %v", err)
	}
	var routes []Route
	for _, p := range strings.Split(os.Getenv(childRoutesEnv), ",") {
		routes = append(routes, Route{Prefix: netip.MustParsePrefix(p)})
	}
	cfg := speakerConfig(PeerConfig{
		Address:         netip.MustParseAddr("127.0.0.1"),
		Port:            uint16(port),
		AS:              bgptest.RouterAS,
		ConnectRetry:    time.Second,
		GracefulRestart: GracefulRestartConfig{Enabled: true, RestartTime: 120 * time.Second},
	})
	cfg.Restarting = os.Getenv(childRestartingEnv) == "1"
	s, err := New(cfg, bgptest.Logger(t))
	if err != nil {
		t.Fatalf("child: New: %v", err)
	}
	ctx := bgptest.Context(t)
	if err := s.Start(ctx); err != nil {
		t.Fatalf("child: Start: %v", err)
	}
	if _, err := s.SetAdvertised(ctx, routes); err != nil {
		t.Fatalf("child: SetAdvertised: %v", err)
	}
	// The parent kills this process; the bound only guards against an orphan.
	<-ctx.Done()
}

type child struct {
	cmd *exec.Cmd
	out bytes.Buffer
}

func startChild(t *testing.T, routerPort uint16, restarting bool, routes ...netip.Prefix) *child {
	t.Helper()
	var ps []string
	for _, p := range routes {
		ps = append(ps, p.String())
	}
	c := &child{}
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestSpeakerChildProcess$", "-test.v")
	c.cmd.Env = append(os.Environ(),
		childEnv+"=1",
		childPortEnv+"="+strconv.Itoa(int(routerPort)),
		childRestartingEnv+"="+map[bool]string{false: "0", true: "1"}[restarting],
		childRoutesEnv+"="+strings.Join(ps, ","),
	)
	c.cmd.Stdout = &c.out
	c.cmd.Stderr = &c.out
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start speaker child: %v", err)
	}
	t.Cleanup(func() {
		c.kill()
		if t.Failed() {
			t.Logf("speaker child (pid %d, restarting %v) output:\n%s", c.cmd.Process.Pid, restarting, c.out.String())
		}
	})
	return c
}

// kill plays a crash: SIGKILL, so the kernel closes the BGP connection without
// a NOTIFICATION.
func (c *child) kill() {
	if c.cmd.ProcessState != nil {
		return
	}
	_ = c.cmd.Process.Kill()
	_ = c.cmd.Wait()
}

// TestGracefulRestartKeepsRoutes restarts a speaker process the way a daemon
// upgrade does: killed without Stop, started again with Restarting. The
// router, with graceful restart negotiated, must keep the route throughout,
// refresh it, and drop a route the new process no longer announces.
func TestGracefulRestartKeepsRoutes(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns speaker processes; skipped in -short")
	}
	t.Parallel()
	r := newTestRouter(t, "127.0.0.1")
	r.AddNeighbor("127.0.0.1", bgptest.NeighborOptions{GracefulRestart: true, RestartTime: 90})

	first := startChild(t, r.Port, false, vipA, vipB)
	r.WaitEstablished("127.0.0.1")
	waitRIB(t, r, vipA, vipB)
	checkRestartFlags(t, r, false)

	// Watch the router's RIB from now on: vipA must never be missing.
	var missing atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			rib, err := r.rib()
			if err == nil {
				if _, ok := rib[vipA]; !ok {
					missing.Add(1)
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	stopWatch := func() {
		cancel()
		wg.Wait()
	}
	t.Cleanup(stopWatch)

	first.kill()
	bgptest.Eventually(t, "router keeps the routes as stale", func() error {
		for _, p := range []netip.Prefix{vipA, vipB} {
			stale, err := r.stale(p)
			if err != nil {
				return err
			}
			if !stale {
				return fmt.Errorf("%s not stale yet", p)
			}
		}
		return nil
	})

	startChild(t, r.Port, true, vipA)
	r.WaitEstablished("127.0.0.1")
	checkRestartFlags(t, r, true)
	// End-of-RIB from the restarted speaker ends the restart: vipA is fresh
	// again and vipB, not announced any more, is gone.
	waitRIB(t, r, vipA)
	bgptest.Eventually(t, "vipA refreshed", func() error {
		stale, err := r.stale(vipA)
		if err != nil {
			return err
		}
		if stale {
			return fmt.Errorf("%s still stale", vipA)
		}
		return nil
	})
	stopWatch()
	if n := missing.Load(); n != 0 {
		t.Errorf("router lost %s during the restart (%d polls without it)", vipA, n)
	}
}

// checkRestartFlags checks the Restart State bit and the per-family Forwarding
// State bits of the speaker's OPEN as the router saw it. Routers such as FRR
// drop stale routes at once when the Forwarding State bit is clear.
func checkRestartFlags(t *testing.T, r *testRouter, restarting bool) {
	t.Helper()
	gr, err := r.gracefulRestartCap("127.0.0.1")
	if err != nil {
		t.Fatalf("router: capabilities: %v", err)
	}
	if gr == nil {
		t.Fatal("router: no graceful restart capability from the speaker")
	}
	if got := gr.Flags&0x08 != 0; got != restarting {
		t.Errorf("Restart State bit = %v, want %v", got, restarting)
	}
	if gr.Time != 120 || len(gr.Tuples) != 1 {
		t.Errorf("capability: restart time %d, %d families; want 120, 1", gr.Time, len(gr.Tuples))
	}
	for _, tu := range gr.Tuples {
		if got := tu.Flags&0x80 != 0; got != restarting {
			t.Errorf("Forwarding State bit for AFI %d = %v, want %v", tu.AFI, got, restarting)
		}
	}
}
