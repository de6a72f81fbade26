package integration

import (
	"bufio"
	"errors"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestDrainWait: "lbctl backend drain --wait" blocks while a TCP connection to the
// backend is open, printing its flow count, and returns once the client closes it; with
// --timeout 2s and the connection open, it exits 1 saying how many flows are left.
func TestDrainWait(t *testing.T) {
	tb := newLB(t, options{})
	be := tb.backends[0]
	ap := netip.AddrPortFrom(be.addr4, echoPort).String()
	s := tb.streamOn(t, streamVIP, be.name)
	lb, _ := tb.carrier(t, s.local)
	lbctlArgs := func(args ...string) []string {
		return append([]string{"-s", "unix://" + lb.lbd.sock}, args...)
	}

	// Every LB node drains; the one that carries the stream is the one to wait on.
	tb.lbctlLBs(t, "backend", "drain", "stream", ap)

	start := time.Now()
	out, err := exec.Command(tb.lbctlBin, lbctlArgs("--timeout", "2s", "backend", "drain", "stream", ap, "--wait")...).CombinedOutput()
	took := time.Since(start)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("drain --wait --timeout 2s with an open connection: %v, want exit 1:\n%s", err, out)
	}
	if !strings.Contains(string(out), ": 1 open flow(s)\n") || !strings.Contains(string(out), "still has 1 open flow(s) after --timeout 2s") {
		t.Errorf("drain --wait --timeout 2s printed:\n%s", out)
	}
	if took < 2*time.Second {
		t.Errorf("drain --wait --timeout 2s returned after %v", took)
	}
	t.Logf("drain --wait --timeout 2s: exit 1 after %v", took)

	cmd := exec.Command(tb.lbctlBin, lbctlArgs("--timeout", "120s", "backend", "drain", "stream", ap, "--wait")...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	done := make(chan struct{})
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			// The test failed while lbctl still waits: end this process only.
			_ = cmd.Process.Kill()
			<-done
		}
	})
	waitLine := func(want string) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for {
			select {
			case l, open := <-lines:
				if !open {
					t.Fatalf("lbctl ended before printing %q; stderr: %s", want, stderr.String())
				}
				t.Logf("lbctl: %s", l)
				if strings.Contains(l, want) {
					return
				}
			case <-deadline:
				t.Fatalf("lbctl printed no %q within 30 s", want)
			}
		}
	}
	waitLine(": 1 open flow(s)")
	// It keeps waiting while the connection is open and echoing.
	if err := s.progress(100, 10*time.Second); err != nil {
		t.Fatalf("the stream to the draining backend: %v", err)
	}
	select {
	case l := <-lines:
		t.Fatalf("lbctl printed %q while the connection is open", l)
	default:
	}

	closed := time.Now()
	s.close()
	waitLine(": 0 open flow(s)")
	waitLine("drained after")
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("drain --wait after the connection closed: %v; stderr: %s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("lbctl still runs 30 s after it printed that the backend drained")
	}
	t.Logf("drain --wait returned %v after the client closed the connection (it counts every second)", time.Since(closed))
}
