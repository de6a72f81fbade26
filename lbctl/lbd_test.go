package lbctl

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/lbd-dev/lbd/internal/testpki"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// buildBinaries builds lbd and lbctl (with Version set) into dir.
func buildBinaries(t *testing.T, dir, lbctlVersion string) {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("needs the go tool to build lbd: ", err)
	}
	cmd := exec.Command(goTool, "build", "-o", dir,
		"-ldflags", "-X github.com/lbd-dev/lbd/lbctl.Version="+lbctlVersion,
		"github.com/lbd-dev/lbd/cmd/lbd", "github.com/lbd-dev/lbd/cmd/lbctl")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build lbd and lbctl: %v\n%s", err, out)
	}
}

// daemon is an lbd process started by a test.
type daemon struct {
	cmd    *exec.Cmd
	stderr bytes.Buffer
	done   chan error
}

func startDaemon(t *testing.T, bin string, args ...string) *daemon {
	t.Helper()
	d := &daemon{cmd: exec.Command(bin, args...), done: make(chan error, 1)}
	d.cmd.Stderr = &d.stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("start lbd: %v", err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case <-d.done:
		default:
			// Still running because the test failed early: kill this process only.
			_ = d.cmd.Process.Kill()
			<-d.done
		}
		if t.Failed() {
			t.Logf("lbd (pid %d) log:\n%s", d.cmd.Process.Pid, d.stderr.String())
		}
	})
	return d
}

// stop sends SIGTERM to the daemon and waits for a clean exit.
func (d *daemon) stop(t *testing.T) {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("signal lbd: %v", err)
	}
	select {
	case err := <-d.done:
		d.done <- err // for the cleanup
		if err != nil {
			t.Fatalf("lbd exited with %v after SIGTERM", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("lbd did not stop within 15 s of SIGTERM")
	}
}

// runBinary runs the lbctl binary with env added to the environment.
func runBinary(t *testing.T, bin string, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("run lbctl: %v", err)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errOut.String()}
}

// startBinaryWatch runs the lbctl binary in the background; its stdout arrives line by
// line in the returned watchRun.
func startBinaryWatch(t *testing.T, bin string, env []string, args ...string) *watchRun {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &watchRun{lines: make(chan timedLine, 1000), done: make(chan result, 1)}
	exited := make(chan struct{})
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			w.lines <- timedLine{s.Text(), time.Now()}
		}
		close(w.lines)
		_ = cmd.Wait()
		w.done <- result{code: cmd.ProcessState.ExitCode(), stderr: errOut.String()}
		close(exited)
	}()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			// The test failed before lbd stopped: end this process only.
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	return w
}

// waitReady polls the daemon with lbctl until it answers.
func waitReady(t *testing.T, lbctlBin, server string, d *daemon) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		r := runBinary(t, lbctlBin, nil, "--server", server, "--timeout", "1s", "node", "get")
		if r.code == ExitOK {
			return
		}
		select {
		case err := <-d.done:
			d.done <- err
			t.Fatalf("lbd exited early (%v)", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("lbd did not answer within 15 s: %s", r.stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRealDaemon runs the lbctl binary against a real lbd process: over the Unix socket
// (given by LBCTL_SERVER), over mutual-TLS TCP, and across a restart of the daemon.
func TestRealDaemon(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the lbd and lbctl binaries")
	}
	t.Parallel()
	bin := t.TempDir()
	buildBinaries(t, bin, "v0.0.0-lbctl-test")
	lbdBin, lbctlBin := filepath.Join(bin, "lbd"), filepath.Join(bin, "lbctl")

	// Unix socket paths are limited to 108 bytes; t.TempDir can be longer.
	sockDir, err := os.MkdirTemp("", "lbctl-lbd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "lbd.sock")
	stateDir := t.TempDir()

	dir := t.TempDir()
	ca := testpki.NewCA(t, "lbd test CA")
	srvCert, srvKey := issue(t, ca, true, "lbd.test")
	cliCert, cliKey := issue(t, ca, false, "operator")
	caFile, srvCertFile, srvKeyFile := writeFile(t, dir, "ca.pem", ca.PEM), writeFile(t, dir, "srv.pem", srvCert), writeFile(t, dir, "srv-key.pem", srvKey)
	cliCertFile, cliKeyFile := writeFile(t, dir, "cli.pem", cliCert), writeFile(t, dir, "cli-key.pem", cliKey)
	// A free port: taken from the kernel and released for lbd to bind.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tcpAddr := l.Addr().String()
	l.Close()

	// The client certificate (CN=operator) may read over TCP; without a policy it could not.
	policy := writeFile(t, dir, "policy.yaml", []byte("rules:\n  - role: reader\n    principals: [\"CN=operator\"]\n"))
	config := writeFile(t, dir, "lbd.yaml", []byte("api:\n  policy_file: "+policy+"\n"))
	lbdArgs := []string{"-socket", sock, "-state-dir", stateDir, "-listen", tcpAddr, "-config", config,
		"-tls-cert", srvCertFile, "-tls-key", srvKeyFile, "-tls-client-ca", caFile}
	d := startDaemon(t, lbdBin, lbdArgs...)
	waitReady(t, lbctlBin, sock, d)

	env := []string{serverEnv + "=unix://" + sock}
	run := func(args ...string) result {
		t.Helper()
		return runBinary(t, lbctlBin, env, args...)
	}
	mustRun := func(args ...string) string {
		t.Helper()
		r := run(args...)
		if r.code != ExitOK || r.stderr != "" {
			t.Fatalf("lbctl %v: exit %d, stderr %q", args, r.code, r.stderr)
		}
		return r.stdout
	}

	mustRun("service", "create", "web", "--vip", "203.0.113.10", "--port", "443", "--protocol", "tcp",
		"--backend", "198.18.1.10:8443", "--backend", "198.18.1.11:8443,weight=2", "--affinity-timeout", "5m")
	mustRun("backend", "add", "web", "198.18.1.12:8443")
	mustRun("backend", "drain", "web", "198.18.1.10:8443")
	mustRun("bgp", "peer", "add", "198.18.0.1", "--as", "65000")
	var before lbdv1.Service
	parseJSON(t, mustRun("service", "get", "web", "-o", "json"), &before)
	if len(before.Backends) != 3 || before.Backends[0].State != lbdv1.BackendState_BACKEND_STATE_DRAINING {
		t.Fatalf("service as created: %v", &before)
	}

	versionOut, _ := exec.Command(lbdBin, "-version").CombinedOutput()
	lbdVersion := strings.TrimSpace(strings.TrimPrefix(string(versionOut), "lbd"))
	rows := table(t, mustRun("version"))
	if len(rows) != 2 || rows[0][1] != "v0.0.0-lbctl-test" || rows[1][1] != lbdVersion {
		t.Errorf("version: %v; want client v0.0.0-lbctl-test, server %q", rows, lbdVersion)
	}

	if r := run("service", "get", "nope"); r.code != ExitError || r.stdout != "" || r.stderr != "lbctl: service \"nope\" not found (code: NotFound)\n" {
		t.Errorf("get of a missing service: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := run("service", "frobnicate"); r.code != ExitUsage || r.stdout != "" {
		t.Errorf("unknown command: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}

	// The same over TCP with mutual TLS; refused without TLS flags.
	tlsFlags := []string{"--server", tcpAddr, "--tls-cert", cliCertFile, "--tls-key", cliKeyFile, "--tls-ca", caFile}
	var list lbdv1.ListServicesResponse
	parseJSON(t, mustRun(append(tlsFlags, "service", "list", "-o", "json")...), &list)
	if len(list.Services) != 1 || list.Services[0].Name != "web" {
		t.Errorf("service list over TLS: %v", &list)
	}
	if r := run("--server", tcpAddr, "service", "list"); r.code != ExitUsage || !strings.Contains(r.stderr, "mutual TLS") {
		t.Errorf("TCP without TLS flags: exit %d, stderr %q", r.code, r.stderr)
	}

	// A watch of the real daemon prints another client's change, and ends with exit 1
	// when lbd stops.
	watch := startBinaryWatch(t, lbctlBin, env, "service", "get", "web", "-w", "-o", "json")
	watch.next(t, `"name":"web"`)
	var lat []time.Duration
	for i := 3; i < 13; i++ {
		start := time.Now()
		mustRun("backend", "set-weight", "web", "198.18.1.12:8443", strconv.Itoa(i))
		l := watch.next(t, `"weight":`+strconv.Itoa(i)+`,`)
		lat = append(lat, l.at.Sub(start))
	}
	slices.Sort(lat)
	t.Logf("lbctl binary: a change by another lbctl printed after min %v, median %v, max %v (10 changes)", lat[0], lat[len(lat)/2], lat[len(lat)-1])
	before.Reset()
	parseJSON(t, mustRun("service", "get", "web", "-o", "json"), &before)

	// The state survives a restart of the daemon.
	d.stop(t)
	// lbd ends the watch with "lbd is shutting down", or its connection closes first.
	if r := <-watch.done; r.code != ExitError || !strings.HasPrefix(r.stderr, "lbctl: lbd at ") || !strings.HasSuffix(r.stderr, "(code: Unavailable)\n") {
		t.Errorf("watch when lbd stopped: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := run("service", "list"); r.code != ExitError || !strings.HasSuffix(r.stderr, "(code: Unavailable)\n") {
		t.Errorf("with lbd stopped: exit %d, stderr %q", r.code, r.stderr)
	}
	d = startDaemon(t, lbdBin, lbdArgs...)
	waitReady(t, lbctlBin, sock, d)
	var after lbdv1.Service
	parseJSON(t, mustRun("service", "get", "web", "-o", "json"), &after)
	after.Status, before.Status = nil, nil
	if !proto.Equal(&before, &after) {
		t.Errorf("service after restart:\n got %v\nwant %v", &after, &before)
	}
	if rows := table(t, mustRun("bgp", "peers")); len(rows) != 2 || rows[1][0] != "198.18.0.1" {
		t.Errorf("bgp peers after restart: %v", rows)
	}
	d.stop(t)
}
