//go:build linux

package examplestest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/daemon/datapath"
	"github.com/lbd-dev/lbd/internal/testnet"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// maxExposure is the most `systemd-analyze security` may say of a unit (issue 22).
const maxExposure = 3.0

var exposureRE = regexp.MustCompile(`Overall exposure level for \S+: (\d+\.\d)`)

// TestSystemdSecurity scores every unit with `systemd-analyze security --offline=yes`:
// at most maxExposure, and the figure the unit's own comment states.
func TestSystemdSecurity(t *testing.T) {
	analyze := needTool(t, "systemd-analyze")
	units, err := filepath.Glob(path("examples", "systemd", "*.service"))
	if err != nil || len(units) == 0 {
		t.Fatalf("units in examples/systemd: %v, %v", units, err)
	}
	for _, file := range units {
		t.Run(filepath.Base(file), func(t *testing.T) {
			exposure := unitExposure(t, analyze, file)
			if exposure > maxExposure {
				t.Errorf("exposure %.1f, want at most %.1f", exposure, maxExposure)
			}
			stated := regexp.MustCompile(`systemd-analyze security: (\d+\.\d)\)`).FindStringSubmatch(readFile(t, "examples", "systemd", filepath.Base(file)))
			if stated == nil {
				t.Fatal("the unit's comment does not state its exposure as `(systemd-analyze security: N.N)`")
			}
			if stated[1] != fmt.Sprintf("%.1f", exposure) {
				t.Errorf("the comment says %s, systemd-analyze says %.1f", stated[1], exposure)
			}
		})
	}
}

// unitExposure returns the overall exposure systemd-analyze computes for a unit file,
// with --threshold failing the command above maxExposure as CI would.
func unitExposure(t *testing.T, analyze, file string) float64 {
	t.Helper()
	cmd := exec.Command(analyze, "security", "--offline=yes", "--no-pager",
		fmt.Sprintf("--threshold=%d", int(maxExposure*10)), file)
	out, err := cmd.CombinedOutput()
	m := exposureRE.FindSubmatch(out)
	if m == nil {
		t.Fatalf("systemd-analyze security %s: %v: no overall exposure in:\n%s", filepath.Base(file), err, out)
	}
	exposure, perr := strconv.ParseFloat(string(m[1]), 64)
	if perr != nil {
		t.Fatal(perr)
	}
	if err != nil && exposure <= maxExposure {
		t.Errorf("systemd-analyze security --threshold: %v although the exposure is %.1f:\n%s", err, exposure, out)
	}
	t.Logf("%s: exposure %.1f", filepath.Base(file), exposure)
	return exposure
}

// TestSystemdSandbox runs lbd as each lbd unit confines it, as far as that can be done
// without systemd: with only the unit's CapabilityBoundingSet (setpriv), and traced
// (strace) to check that every system call it makes is in the unit's SystemCallFilter
// (expanded by `systemd-analyze syscall-filter`) and every socket family in its
// RestrictAddressFamilies. The daemon must become ready, program a service (LB node),
// attach socket-level load balancing to a cgroup of the test's, and stop cleanly.
func TestSystemdSandbox(t *testing.T) {
	testnet.Require(t, "ip", "nsenter", "setpriv", "strace", "systemd-analyze")
	groups := syscallGroups(t)
	for _, name := range []string{"lbd-lb.service", "lbd-backend.service"} {
		t.Run(name, func(t *testing.T) {
			u := parseUnit(t, path("examples", "systemd", name))
			caps := strings.Fields(u.one(t, "Service", "CapabilityBoundingSet"))
			allowed := allowedSyscalls(t, groups, u["Service"]["SystemCallFilter"])
			families := strings.Fields(u.one(t, "Service", "RestrictAddressFamilies"))
			role := flagValue(t, strings.Fields(u.one(t, "Service", "ExecStart")), "--role")
			trace := runSandboxed(t, role, caps)
			used := tracedSyscalls(t, trace)
			var denied []string
			for _, s := range used {
				if !allowed[s] {
					denied = append(denied, s)
				}
			}
			if len(denied) > 0 {
				t.Errorf("lbd --role %s made system calls that SystemCallFilter denies: %v", role, denied)
			}
			for _, f := range tracedFamilies(trace) {
				if !slices.Contains(families, f) {
					t.Errorf("lbd --role %s opened an %s socket, not in RestrictAddressFamilies %v", role, f, families)
				}
			}
			if len(used) < 20 {
				t.Fatalf("only %d distinct system calls traced: %v", len(used), used)
			}
		})
	}
}

// flagValue returns the value of a flag in a command line.
func flagValue(t *testing.T, args []string, flag string) string {
	t.Helper()
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
	}
	t.Fatalf("%v has no %s", args, flag)
	return ""
}

// runSandboxed starts lbd in role in a namespace of its own, with only caps, under
// strace, waits until it is ready and has done its work, stops it with SIGTERM, and
// returns the trace.
func runSandboxed(t *testing.T, role string, caps []string) string {
	t.Helper()
	sfx := testnet.Suffix(t)
	ns := testnet.NewNS(t, "sbx-"+sfx)
	testnet.Veth(t, testnet.VethEnd{NS: ns, Name: "up0"}, testnet.VethEnd{NS: ns, Name: "up1"})
	ns.PassXDP(t, "up1")
	// A route toward the service's backend node: the LB node keeps a neighbour for it.
	ns.IP(t, "addr add 198.18.0.1/24 dev up0", "route add 198.18.1.0/24 via 198.18.0.2")
	bpffs := testnet.BPFFS(t)
	dir, err := os.MkdirTemp("", "lbd-sbx-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "lbd.sock")
	trace := filepath.Join(dir, "trace")

	bounding := "-all"
	for _, c := range caps {
		bounding += ",+" + strings.ToLower(strings.TrimPrefix(c, "CAP_"))
	}
	args := []string{"setpriv", "--bounding-set=" + bounding, "--inh-caps=-all", "--",
		"strace", "-f", "-qq", "-o", trace, filepath.Join(binDir, "lbd"),
		"--role", role, "--interface", "up0", "--bpffs-dir", filepath.Join(bpffs, "lbd"),
		"--state-dir", filepath.Join(dir, "state"), "--socket", sock, "--metrics-listen", "",
		"--conntrack-size", "4096"}
	switch role {
	case "lb":
		args = append(args, "--socket-lb-cgroup", testCgroup(t, sfx))
	case "backend":
		args = append(args, "--lb-source", "198.18.0.0/24")
	}
	cmd := ns.Command(args...)
	p := testnet.Start(t, "lbd-"+role, filepath.Join(dir, "log"), cmd)

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitServing(t, p, healthpb.NewHealthClient(conn))
	if role == "lb" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		lb := lbdv1.NewLoadBalancerServiceClient(conn)
		svc := &lbdv1.Service{Name: "web", Vip: "203.0.113.10", Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP,
			Backends: []*lbdv1.Backend{{Address: "198.18.1.10", Port: 8080}}}
		if _, err := lb.CreateService(ctx, &lbdv1.CreateServiceRequest{Service: svc}); err != nil {
			t.Fatalf("create service: %v\n%s", err, p.Tail(20))
		}
		for {
			got, err := lb.GetService(ctx, &lbdv1.GetServiceRequest{Name: "web"})
			if err != nil {
				t.Fatalf("get service: %v", err)
			}
			if got.GetService().GetStatus().GetState() != lbdv1.ServiceState_SERVICE_STATE_PENDING {
				if s := got.GetService().GetStatus(); s.GetState() != lbdv1.ServiceState_SERVICE_STATE_READY {
					t.Errorf("service state %v (%s), want READY", s.GetState(), s.GetReason())
				}
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// The process started is strace (nsenter and setpriv exec): lbd is its child.
	children, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", p.PID(), p.PID()))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(children)))
	if err != nil {
		t.Fatalf("lbd's PID among strace's children %q: %v", children, err)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited():
	case <-time.After(20 * time.Second):
		t.Fatalf("lbd still runs 20 s after SIGTERM:\n%s", p.Tail(20))
	}
	if !strings.Contains(p.Tail(5), "shutting down") {
		t.Errorf("lbd did not stop cleanly:\n%s", p.Tail(20))
	}
	b, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// waitServing waits until lbd's gRPC health says SERVING: the node is ready.
func waitServing(t *testing.T, p *testnet.Proc, hc healthpb.HealthClient) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		res, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && res.Status == healthpb.HealthCheckResponse_SERVING {
			return
		}
		if !p.Running() {
			t.Fatalf("lbd exited with only the unit's capabilities:\n%s", p.Tail(20))
		}
		if time.Now().After(deadline) {
			t.Fatalf("lbd not ready after 60 s (%v, %v):\n%s", res, err, p.Tail(20))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// testCgroup creates a cgroup v2 directory for socket-level load balancing, removed at
// the end.
func testCgroup(t *testing.T, sfx string) string {
	t.Helper()
	root, err := datapath.CgroupRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "lbd-sbx-"+sfx)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("remove cgroup %s: %v", dir, err)
		}
	})
	return dir
}

// syscallGroups reads systemd's system call groups (@name → members, which may be
// groups) from `systemd-analyze syscall-filter`.
func syscallGroups(t *testing.T) map[string][]string {
	t.Helper()
	out, err := exec.Command("systemd-analyze", "syscall-filter", "--no-pager").Output()
	if err != nil {
		t.Fatalf("systemd-analyze syscall-filter: %v", err)
	}
	groups := map[string][]string{}
	cur := ""
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 0 || strings.HasPrefix(f[0], "#"):
		case strings.HasPrefix(line, "@"):
			cur = f[0]
			groups[cur] = nil
		case cur != "" && (line[0] == ' ' || line[0] == '\t'):
			groups[cur] = append(groups[cur], f[0])
		}
	}
	if len(groups["@system-service"]) == 0 || len(groups["@basic-io"]) == 0 {
		t.Fatalf("systemd-analyze syscall-filter: no @system-service or @basic-io group in:\n%s", out)
	}
	return groups
}

// allowedSyscalls evaluates a unit's SystemCallFilter= lines: an allow list, then "~"
// lines that remove from it.
func allowedSyscalls(t *testing.T, groups map[string][]string, filters []string) map[string]bool {
	t.Helper()
	var expand func(string, map[string]bool)
	expand = func(name string, into map[string]bool) {
		if !strings.HasPrefix(name, "@") {
			into[name] = true
			return
		}
		members, ok := groups[name]
		if !ok {
			t.Fatalf("SystemCallFilter names %s, which systemd does not know", name)
		}
		for _, m := range members {
			expand(m, into)
		}
	}
	allowed := map[string]bool{}
	for i, f := range filters {
		deny := strings.HasPrefix(f, "~")
		if i == 0 && deny {
			t.Fatal("SystemCallFilter starts with a deny list: want an allow list")
		}
		set := map[string]bool{}
		for _, name := range strings.Fields(strings.TrimPrefix(f, "~")) {
			expand(name, set)
		}
		for s := range set {
			if deny {
				delete(allowed, s)
			} else {
				allowed[s] = true
			}
		}
	}
	if len(allowed) == 0 {
		t.Fatal("the unit has no SystemCallFilter=")
	}
	return allowed
}

var syscallRE = regexp.MustCompile(`(?m)^\d+\s+([a-z0-9_]+)\(`)

// tracedSyscalls returns the distinct system calls of an strace -f log.
func tracedSyscalls(t *testing.T, trace string) []string {
	t.Helper()
	seen := map[string]bool{}
	for _, m := range syscallRE.FindAllStringSubmatch(trace, -1) {
		seen[m[1]] = true
	}
	if !seen["bpf"] {
		t.Fatal("the trace holds no bpf() call: strace did not follow lbd")
	}
	out := make([]string, 0, len(seen))
	for s := range seen {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

var familyRE = regexp.MustCompile(`\bsocket\((AF_[A-Z0-9]+)`)

// tracedFamilies returns the address families of the sockets lbd opened.
func tracedFamilies(trace string) []string {
	var out []string
	for _, m := range familyRE.FindAllStringSubmatch(trace, -1) {
		if !slices.Contains(out, m[1]) {
			out = append(out, m[1])
		}
	}
	return out
}
