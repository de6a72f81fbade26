package lbd_test

import (
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

// TestAdapterTouchesOnlyItsOwners: the Kubernetes adapter's principal (a writer of
// k8s/*) applies its own services and cannot change another owner's, by any RPC.
func TestAdapterTouchesOnlyItsOwners(t *testing.T) {
	e := startAuthzEnv(t, "")
	e.reset(t)
	transports := []string{"tcp"}
	if len(e.users) > 0 {
		transports = append(transports, "unix")
	}
	for _, tr := range transports {
		lb := lbdv1.NewLoadBalancerServiceClient(e.conn(t, "adapter", tr))
		ctx := ctxT(t)
		mine := &lbdv1.Service{Name: "k8s-web-" + tr, Owner: "k8s/default", Vip: "203.0.113.20", Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP}
		if tr == "unix" {
			mine.Vip = "203.0.113.21"
		}
		if _, err := lb.ApplyServices(ctx, &lbdv1.ApplyServicesRequest{Owner: "k8s/default", Services: []*lbdv1.Service{mine}}); err != nil {
			t.Fatalf("adapter over %s applies its own services: %v", tr, err)
		}
		before := e.state(t)
		moved := &lbdv1.Service{Name: mine.Name, Owner: "team-a", Vip: mine.Vip, Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP}
		for name, f := range map[string]func() error{
			"delete team-a's service": func() error {
				_, err := lb.DeleteService(ctx, &lbdv1.DeleteServiceRequest{Name: "team-web"})
				return err
			},
			"apply as team-a": func() error {
				_, err := lb.ApplyServices(ctx, &lbdv1.ApplyServicesRequest{Owner: "team-a"})
				return err
			},
			"apply its owner with team-a's service in it": func() error {
				w := teamWeb()
				w.Owner = ""
				_, err := lb.ApplyServices(ctx, &lbdv1.ApplyServicesRequest{Owner: "k8s/default", Services: []*lbdv1.Service{mine, w}})
				return err
			},
			"give its service to team-a": func() error {
				_, err := lb.UpdateService(ctx, &lbdv1.UpdateServiceRequest{Service: moved})
				return err
			},
			"add a backend to team-a's service": func() error {
				_, err := lb.CreateBackend(ctx, &lbdv1.CreateBackendRequest{ServiceName: "team-web",
					Backend: &lbdv1.Backend{Address: "198.18.1.12", Port: 80, NodeAddress: "198.18.1.1", Weight: 1}})
				return err
			},
			"drain team-a's backend": func() error {
				_, err := lb.UpdateBackend(ctx, &lbdv1.UpdateBackendRequest{ServiceName: "team-web",
					Backend:    &lbdv1.Backend{Address: "198.18.1.10", Port: 8080, State: lbdv1.BackendState_BACKEND_STATE_DRAINING},
					UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"state"}}})
				return err
			},
		} {
			err := f()
			if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `owners "k8s/*"`) {
				t.Errorf("adapter over %s: %s: %v, want PERMISSION_DENIED naming its owners", tr, name, err)
			}
			if after := e.state(t); after != before {
				t.Errorf("adapter over %s: %s was denied but changed the state:\nbefore %s\nafter  %s", tr, name, before, after)
			}
		}
	}
	// An operator changes weight and state on anyone's service, nothing else.
	lb := lbdv1.NewLoadBalancerServiceClient(e.conn(t, "operator", "tcp"))
	_, err := lb.UpdateBackend(ctxT(t), &lbdv1.UpdateBackendRequest{ServiceName: "team-web",
		Backend:    &lbdv1.Backend{Address: "198.18.1.10", Port: 8080, NodeAddress: "198.18.1.2"},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"node_address"}}})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "weight and state") {
		t.Errorf("operator changing a backend's node address: %v, want PERMISSION_DENIED naming what it may change", err)
	}
}

// TestSocketGroupReaderRunsLbctl: a non-root member of the socket's group whom the
// policy makes a reader lists services with lbctl, and is told clearly that it may not
// delete one; a user outside the group cannot connect at all.
func TestSocketGroupReaderRunsLbctl(t *testing.T) {
	e := startAuthzEnv(t, "")
	if len(e.users) == 0 {
		t.Skip("not root: this test creates users and a group")
	}
	e.reset(t)
	lbctl := func(u osUser, args ...string) (string, string, int) {
		cmd := exec.Command(lbctlBin, append([]string{"--server", "unix://" + e.in.socket}, args...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: u.credential()}
		var out, errOut strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("run lbctl as %s: %v", u.name, err)
		}
		return out.String(), errOut.String(), code
	}
	reader := e.users["reader"]
	if reader.uid == 0 {
		t.Fatal("the reader is root")
	}
	out, errOut, code := lbctl(reader, "service", "list")
	if code != 0 || !strings.Contains(out, "team-web") {
		t.Fatalf("lbctl service list as %s (uid %d): exit %d, stdout %q, stderr %q; want team-web listed", reader.name, reader.uid, code, out, errOut)
	}
	before := e.state(t)
	_, errOut, code = lbctl(reader, "service", "delete", "team-web")
	want := "may not call lbd.v1.LoadBalancerService/DeleteService: it needs write access (role writer or admin)"
	if code == 0 || !strings.Contains(errOut, want) || !strings.Contains(errOut, "code: PermissionDenied") {
		t.Errorf("lbctl service delete as a reader: exit %d, stderr %q; want a failure saying %q", code, errOut, want)
	}
	if after := e.state(t); after != before {
		t.Errorf("a refused delete changed the state:\nbefore %s\nafter  %s", before, after)
	}
	t.Logf("a reader's delete: %s", strings.TrimSpace(errOut))
	// Outside the socket's group: the socket's mode keeps it out before the policy.
	outsider := addUser(t, e.sockGroup+"out", e.sockGroup+"o")
	_, errOut, code = lbctl(outsider, "service", "list")
	if code == 0 || !strings.Contains(errOut, "permission denied") {
		t.Errorf("lbctl as a user outside the socket's group: exit %d, stderr %q; want the socket refusing it", code, errOut)
	}
}

// TestPolicyReload: a changed policy takes effect without a restart, on SIGHUP and when
// the file changes; a broken one leaves the previous one in force; every attempt is in
// the audit trail.
func TestPolicyReload(t *testing.T) {
	e := startAuthzEnv(t, "  policy_check_interval: 200ms\n")
	node := lbdv1.NewNodeServiceClient(e.conn(t, "reader", "tcp"))
	drain := func() error {
		_, err := node.DrainNode(ctxT(t), &lbdv1.DrainNodeRequest{})
		return err
	}
	if err := drain(); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a reader drains the node: %v, want PERMISSION_DENIED", err)
	}
	grant := "  - role: operator\n    principals: [\"spiffe://lbd.test/reader\"]\n"
	// The file check is every 200ms: rewrite and signal at once, SIGHUP gets there first
	// or both load the same file; either way the change must take effect.
	e.writePolicy(t, grant)
	e.p.signal(t, syscall.SIGHUP)
	waitFor(t, "the operator grant to take effect", func() bool { return drain() == nil })

	e.writePolicy(t, "  - role: overlord\n    principals: [x]\n")
	e.p.signal(t, syscall.SIGHUP)
	waitFor(t, "the broken policy's reload to be audited", func() bool {
		for _, l := range readAudit(t, e.auditFile) {
			if l.Method == "policy.reload" && l.Code == "InvalidArgument" && strings.Contains(l.Message, `rules[5].role: "overlord"`) {
				return true
			}
		}
		return false
	})
	if err := drain(); err != nil {
		t.Errorf("after a broken policy, the previous one stays in force: drain %v", err)
	}
	// No signal: the file check finds the change.
	e.writePolicy(t, "")
	waitFor(t, "the file change to withdraw the grant", func() bool { return status.Code(drain()) == codes.PermissionDenied })

	var reloads []string
	for _, l := range readAudit(t, e.auditFile) {
		if l.Method == "policy.reload" {
			reloads = append(reloads, l.Principal+" "+l.Code)
			if l.Code == "OK" && !strings.Contains(l.Policy, e.policy+" sha256:") {
				t.Errorf("reload record %+v does not name the policy file and its digest", l)
			}
		}
	}
	for _, want := range []string{"start OK", "InvalidArgument", "file-change OK"} {
		if !slices.ContainsFunc(reloads, func(r string) bool { return strings.Contains(r, want) }) {
			t.Errorf("audit trail's reloads %v lack %q", reloads, want)
		}
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCheckConfigValidatesPolicy: --check-config refuses a broken policy, naming the
// file and the field, and accepts a good one.
func TestCheckConfigValidatesPolicy(t *testing.T) {
	dir := t.TempDir()
	bad := writeFile(t, dir, "bad.yaml", []byte("rules:\n  - role: reader\n    principals: [a]\n  - role: writer\n    principals: [b]\n"))
	good := writeFile(t, dir, "good.yaml", []byte("rules:\n  - role: writer\n    owners: [\"k8s/*\"]\n    principals: [b]\n"))
	for _, tc := range []struct {
		policy string
		code   int
		want   []string
	}{
		{bad, 2, []string{"api.policy_file", bad, "rules[1].owners: a writer needs the owners"}},
		{good, 0, []string{"configuration is valid"}},
	} {
		cfg := writeFile(t, dir, "lbd.yaml", []byte("api:\n  policy_file: "+tc.policy+"\n"))
		code, out := runExit(t, 10*time.Second, "--check-config", "--config", cfg)
		if code != tc.code {
			t.Errorf("--check-config with %s: exit %d, want %d; output:\n%s", tc.policy, code, tc.code, out)
		}
		assertContains(t, out, tc.want...)
	}
}
