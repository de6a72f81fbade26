//go:build linux

package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/lbd-dev/lbd/internal/testnet"
)

// spawn starts argv in namespace ns (the host's if ns is nil) with output appended to
// <dir>/<name>.log. The process is killed by its PID when the test ends if it still
// runs, and its log is shown if the test failed.
func (tb *testbed) spawn(name string, ns *testnet.NS, env []string, argv ...string) *testnet.Proc {
	tb.t.Helper()
	return tb.spawnIn(name, ns, "", env, argv...)
}

// spawnIn is spawn with the process started inside the cgroup v2 directory cgroup
// (none if empty).
func (tb *testbed) spawnIn(name string, ns *testnet.NS, cgroup string, env []string, argv ...string) *testnet.Proc {
	tb.t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	if ns != nil {
		cmd = ns.Command(argv...)
	}
	cmd.Env = append(os.Environ(), env...)
	if cgroup != "" {
		testnet.InCgroup(tb.t, cmd, cgroup)
		// Its own process group too, so that Kill stops a shell's children with it.
		cmd.SysProcAttr.Setpgid = true
	}
	return testnet.Start(tb.t, name, filepath.Join(tb.dir, name+".log"), cmd)
}

// startServers runs the HTTP, TCP echo and UDP echo servers of a backend node: the
// test binary itself, in server mode. A test may kill them (be.servers) and call
// startServers again.
func (tb *testbed) startServers(be *node) {
	self, err := os.Executable()
	if err != nil {
		tb.t.Fatal(err)
	}
	env := []string{serverEnv + "=" + be.name}
	if tb.opts.keepalive > 0 {
		env = append(env, keepaliveEnv+"="+tb.opts.keepalive.String())
	}
	be.servers = tb.spawn("servers-"+be.name, be.ns, env, self)
	be.servers.WaitLog(tb.t, "ready", 10*time.Second)
}
