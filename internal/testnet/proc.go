//go:build linux

package testnet

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Proc is a process the test started, stopped by its PID when the test ends.
type Proc struct {
	Name string
	// Log is the file its standard output and error are appended to.
	Log string
	cmd *exec.Cmd
	// logFrom is the size of the log when this process started: a restarted process
	// appends to the log of the one before.
	logFrom int64
	exited  chan struct{}
}

// Start starts cmd (from NS.Command for a process in a namespace) with its output
// appended to the file log. At cleanup the process is killed if it still runs, and the
// end of the log is shown if the test failed.
func Start(tb testing.TB, name, log string, cmd *exec.Cmd) *Proc {
	tb.Helper()
	p := &Proc{Name: name, Log: log, cmd: cmd, exited: make(chan struct{})}
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil {
		p.logFrom = st.Size()
	}
	fmt.Fprintf(f, "=== %s: %s\n", time.Now().Format(time.TimeOnly), strings.Join(cmd.Args, " "))
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", name, err)
	}
	go func() {
		cmd.Wait()
		close(p.exited)
	}()
	tb.Cleanup(func() {
		p.Kill()
		if tb.Failed() {
			tb.Logf("log of %s:\n%s", name, p.Tail(40))
		}
	})
	return p
}

// InCgroup makes cmd start inside the cgroup v2 directory dir (CLONE_INTO_CGROUP), so
// that no moment of its life is spent outside it. Call it before Start.
func InCgroup(tb testing.TB, cmd *exec.Cmd, dir string) {
	tb.Helper()
	f, err := os.Open(dir)
	if err != nil {
		tb.Fatalf("open cgroup: %v", err)
	}
	// The child gets its own copy at fork; this one lives until the test ends, since
	// the command may start at any time before.
	tb.Cleanup(func() { f.Close() })
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(f.Fd())
}

// Signal sends sig to the process (not to its group).
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// PID is the process's ID.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Exited is closed once the process has exited.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Running reports whether the process has not exited.
func (p *Proc) Running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Kill sends SIGKILL to the process, or to its process group if cmd was started in one
// of its own (SysProcAttr.Setpgid: a shell's children then die with it), and waits for
// the process to exit.
func (p *Proc) Kill() {
	if !p.Running() {
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

// WaitLog waits until the process's own part of the log holds want, failing if it
// exits first.
func (p *Proc) WaitLog(tb testing.TB, want string, timeout time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		b, _ := os.ReadFile(p.Log)
		if int64(len(b)) >= p.logFrom && strings.Contains(string(b[p.logFrom:]), want) {
			return
		}
		if !p.Running() {
			tb.Fatalf("%s exited before logging %q:\n%s", p.Name, want, p.Tail(40))
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s did not log %q within %v:\n%s", p.Name, want, timeout, p.Tail(40))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// OwnLog returns the process's own part of the log: what it wrote since it started.
func (p *Proc) OwnLog() string {
	b, err := os.ReadFile(p.Log)
	if err != nil || int64(len(b)) < p.logFrom {
		return ""
	}
	return string(b[p.logFrom:])
}

// Tail returns the last n lines of the log.
func (p *Proc) Tail(n int) string {
	b, err := os.ReadFile(p.Log)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
