//go:build linux

package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// proc is a child process running inside a network namespace. It is started with
// nsenter, which only switches the network namespace (unlike `ip netns exec`, which
// remounts /sys and hides the bpffs), and stopped by its PID.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	// logFrom is the size of the log when this process started: a restarted process
	// appends to the log of the earlier one.
	logFrom int64
	exited  chan struct{}
}

// spawn starts argv in namespace ns (the host's if ns is empty) with output appended to
// <dir>/<name>.log. The process is killed when the test ends if it still runs, and its
// log is shown if the test failed.
func (tb *testbed) spawn(name, ns string, env []string, argv ...string) *proc {
	tb.t.Helper()
	return tb.spawnIn(name, ns, "", env, argv...)
}

// spawnIn is spawn with the process started inside the cgroup v2 directory cgroup
// (none if empty).
func (tb *testbed) spawnIn(name, ns, cgroup string, env []string, argv ...string) *proc {
	t := tb.t
	t.Helper()
	p := &proc{name: name, log: filepath.Join(tb.dir, name+".log"), exited: make(chan struct{})}
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil {
		p.logFrom = st.Size()
	}
	fmt.Fprintf(f, "=== %s: %s\n", time.Now().Format(time.TimeOnly), strings.Join(argv, " "))
	if ns == "" {
		p.cmd = exec.Command(argv[0], argv[1:]...)
	} else {
		p.cmd = exec.Command("nsenter", append([]string{"--net=/run/netns/" + ns, "--"}, argv...)...)
	}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if cgroup != "" {
		cg, err := os.Open(cgroup)
		if err != nil {
			t.Fatal(err)
		}
		defer cg.Close()
		// Its own process group too, so that kill stops a shell's children with it.
		p.cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd()), Setpgid: true}
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("log of %s:\n%s", name, tail(p.log, 40))
		}
	})
	return p
}

// running reports whether the process has not exited.
func (p *proc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// kill sends SIGKILL to the process (by PID) and waits for it to exit.
func (p *proc) kill() {
	if !p.running() {
		return
	}
	if a := p.cmd.SysProcAttr; a != nil && a.Setpgid {
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) // the group this test started
	} else {
		p.cmd.Process.Signal(syscall.SIGKILL)
	}
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
	}
}

// waitLog waits until the process's own part of the log holds want, failing if it
// exits first.
func (p *proc) waitLog(t *testing.T, want string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		b, _ := os.ReadFile(p.log)
		if int64(len(b)) >= p.logFrom && strings.Contains(string(b[p.logFrom:]), want) {
			return
		}
		if !p.running() {
			t.Fatalf("%s exited before logging %q:\n%s", p.name, want, tail(p.log, 40))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not log %q within %v:\n%s", p.name, want, timeout, tail(p.log, 40))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// startServers runs the HTTP, TCP echo and UDP echo servers of a backend node: the
// test binary itself, in server mode. A test may kill them (be.servers) and call
// startServers again.
func (tb *testbed) startServers(be *node) {
	self, err := os.Executable()
	if err != nil {
		tb.t.Fatal(err)
	}
	be.servers = tb.spawn("servers-"+be.name, be.ns, []string{serverEnv + "=" + be.name}, self)
	be.servers.waitLog(tb.t, "ready", 10*time.Second)
}
