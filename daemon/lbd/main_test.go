package lbd_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// lbdBin and lbctlBin are the real binaries, built once by TestMain: these tests run
// them as child processes, the way an operator or systemd does.
var lbdBin, lbctlBin string

func TestMain(m *testing.M) {
	if socket := os.Getenv(connectHelperEnv); socket != "" {
		os.Exit(connectHelper(socket))
	}
	if spec := os.Getenv(abuserEnv); spec != "" {
		os.Exit(abuserMain(spec))
	}
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	root, err := moduleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "lbd-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "create build directory:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	// Other users run lbctl and the connect helper from here (the authorization tests).
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "open build directory:", err)
		return 1
	}
	lbdBin, lbctlBin = filepath.Join(dir, "lbd"), filepath.Join(dir, "lbctl")
	for bin, pkg := range map[string]string{lbdBin: "./cmd/lbd", lbctlBin: "./cmd/lbctl"} {
		build := exec.Command("go", "build", "-o", bin, pkg)
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", pkg, err, out)
			return 1
		}
	}
	if helperBin, err = copyHelper(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// moduleRoot finds the directory of go.mod above the test's working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("get working directory: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("find module root: no go.mod above the working directory")
		}
		dir = parent
	}
}

// shortTempDir returns a fresh directory removed at the end of the test. Unix socket paths
// are limited to 108 bytes, which t.TempDir's long names can exceed.
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "lbd-")
	if err != nil {
		t.Fatalf("create temporary directory: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// instance is where one lbd keeps its state and socket.
type instance struct {
	stateDir string
	socket   string
}

func newInstance(t testing.TB) instance {
	dir := shortTempDir(t)
	return instance{stateDir: filepath.Join(dir, "state"), socket: filepath.Join(dir, "lbd.sock")}
}

func (in instance) statePath() string { return filepath.Join(in.stateDir, "state.pb") }

// args are the flags that keep an lbd away from the system's default paths.
func (in instance) args(extra ...string) []string {
	return append([]string{"--state-dir", in.stateDir, "--socket", in.socket, "--log-level", "debug"}, extra...)
}

// syncBuffer collects a child's output while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// proc is a running lbd process.
type proc struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{}
	err    error // Wait's result, valid once done is closed
}

// spawn starts lbd with args. The process is killed (by its PID) at the end of the test
// if it is still running.
func spawn(t testing.TB, args ...string) *proc {
	t.Helper()
	return spawnCmd(t, exec.Command(lbdBin, args...))
}

// spawnCmd starts cmd, which runs lbd (directly, or through nsenter, which execs it), as
// spawn does.
func spawnCmd(t testing.TB, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd.Stdout = p.stderr
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start lbd: %v", err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("lbd (pid %d) output:\n%s", p.cmd.Process.Pid, p.stderr.String())
		}
	})
	return p
}

// signal sends sig to the process by its PID.
func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("send %v to lbd: %v", sig, err)
	}
}

// wait waits for the process to exit and returns its exit code; -1 means it was killed
// by a signal.
func (p *proc) wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("lbd (pid %d) still running after %v; output:\n%s", p.cmd.Process.Pid, timeout, p.stderr.String())
	}
	var ee *exec.ExitError
	switch {
	case p.err == nil:
		return 0
	case errors.As(p.err, &ee):
		return ee.ExitCode()
	default:
		t.Fatalf("wait for lbd: %v", p.err)
		return 0
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// startLBD starts lbd on in and returns once its API on the Unix socket reports SERVING.
func startLBD(t testing.TB, in instance, extra ...string) (*proc, *grpc.ClientConn) {
	t.Helper()
	p := spawn(t, in.args(extra...)...)
	deadline := time.Now().Add(15 * time.Second)
	// Dialing before the socket exists would cost a reconnection backoff of a second.
	for _, err := os.Stat(in.socket); err != nil && !p.exited() && time.Now().Before(deadline); _, err = os.Stat(in.socket) {
		time.Sleep(10 * time.Millisecond)
	}
	conn := dialUnix(t, in.socket)
	hc := healthpb.NewHealthClient(conn)
	for {
		if p.exited() {
			t.Fatalf("lbd exited during start (code %d); output:\n%s", p.wait(t, 0), p.stderr.String())
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		res, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && res.Status == healthpb.HealthCheckResponse_SERVING {
			return p, conn
		}
		if time.Now().After(deadline) {
			t.Fatalf("lbd not serving after 15s (last health check: %v, %v); output:\n%s", res, err, p.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// dialUnix returns a client of the socket, closed at the end of the test. It accepts
// replies beyond gRPC's 4 MiB default so that the size of a large state (logged by the
// restart test) is not mistaken for a daemon failure.
func dialUnix(t testing.TB, socket string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20)))
	if err != nil {
		t.Fatalf("dial %s: %v", socket, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// runExit runs lbd expecting it to exit by itself within timeout, and returns its exit
// code and output.
func runExit(t *testing.T, timeout time.Duration, args ...string) (int, string) {
	t.Helper()
	p := spawn(t, args...)
	code := p.wait(t, timeout)
	return code, p.stderr.String()
}

// assertContains fails the test for each of want that out lacks (case-insensitively).
func assertContains(t *testing.T, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(strings.ToLower(out), strings.ToLower(w)) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
