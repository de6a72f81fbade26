package examplestest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// TestAdapterIdentity runs lbd with the API settings and the policy the chart deploys on
// LB nodes (with examples/k8s, which TestHelmChartMatchesExamples keeps alike), and
// lbctl as the adapter sidecar's user and group (its securityContext): through the
// socket, that user can apply the services of the adapter's owner, and can neither
// delete nor replace the services of another owner, which stay as they were.
func TestAdapterIdentity(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: lbctl runs as the adapter's uid")
	}
	objs := renderChart(t)
	cm := map[string]any(objs["ConfigMap/lbd-lb"])
	tmpl, _ := get(cm, "data", "lbd.yaml.tmpl").(string)
	policy, _ := get(cm, "data", "policy.yaml").(string)
	var adapter struct {
		Owner string `json:"owner"`
	}
	if err := yaml.Unmarshal([]byte(fmt.Sprint(get(cm, "data", "k8s-adapter.yaml"))), &adapter); err != nil || adapter.Owner == "" {
		t.Fatalf("the adapter's owner: %v", err)
	}
	var node struct {
		API map[string]any `json:"api"`
	}
	if err := yaml.Unmarshal([]byte(renderNodeConfig(t, tmpl)), &node); err != nil {
		t.Fatal(err)
	}
	sc := get(containers(objs["DaemonSet/lbd-lb"])["k8s-adapter"], "securityContext").(map[string]any)
	uid, gid := toID(t, sc["runAsUser"]), toID(t, sc["runAsGroup"])
	if sc["runAsNonRoot"] != true || uid == 0 {
		t.Fatalf("the adapter sidecar runs as %v (runAsNonRoot %v): on the socket, root is admin", sc["runAsUser"], sc["runAsNonRoot"])
	}

	// lbd as the chart configures it, control plane only: the API section with the
	// socket and the policy file moved into the test's directory, which the adapter's
	// user may enter.
	dir, err := os.MkdirTemp("", "lbd-id-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	api := node.API
	sock := filepath.Join(dir, "lbd.sock")
	api["socket"] = sock
	api["policy_file"] = writeTo(t, dir, "policy.yaml", policy)
	cfg, err := yaml.Marshal(map[string]any{"state_dir": filepath.Join(dir, "state"), "metrics_listen": "", "api": api})
	if err != nil {
		t.Fatal(err)
	}
	lbd := exec.Command(filepath.Join(binDir, "lbd"), "--config", writeTo(t, dir, "lbd.yaml", string(cfg)))
	var lbdOut bytes.Buffer
	lbd.Stdout, lbd.Stderr = &lbdOut, &lbdOut
	if err := lbd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		lbd.Process.Kill()
		lbd.Wait()
		if t.Failed() {
			t.Logf("lbd:\n%s", lbdOut.String())
		}
	})

	// lbctl runs as root (admin) or as the adapter's user.
	lbctl := func(asAdapter bool, args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(binDir, "lbctl"), append([]string{"--server", sock}, args...)...)
		if asAdapter {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
		}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := lbctl(false, "service", "list")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lbd not serving after 15 s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	file := func(owner, name, vip string) string {
		return writeTo(t, dir, name+".yaml", fmt.Sprintf("owner: %s\nservices:\n  - name: %s\n    vip: %s\n    port: 80\n    protocol: PROTOCOL_TCP\n"+
			"    backends:\n      - {address: 198.18.1.10, port: 8080}\n", owner, name, vip))
	}
	if out, err := lbctl(false, "apply", "-f", file("team-b", "theirs", "203.0.113.20")); err != nil {
		t.Fatalf("admin: lbctl apply of team-b's service: %v\n%s", err, out)
	}
	before, err := lbctl(false, "service", "get", "theirs", "-o", "json")
	if err != nil {
		t.Fatalf("admin: lbctl service get: %v\n%s", err, before)
	}

	if out, err := lbctl(true, "apply", "-f", file(adapter.Owner, "mine", "203.0.113.21")); err != nil {
		t.Errorf("adapter: lbctl apply of its owner %s: %v\n%s", adapter.Owner, err, out)
	}
	for _, args := range [][]string{
		{"service", "delete", "theirs"},
		{"apply", "-f", file("team-b", "theirs", "203.0.113.22")},
	} {
		out, err := lbctl(true, args...)
		if err == nil || !strings.Contains(out, "PermissionDenied") {
			t.Errorf("adapter: lbctl %s: %v, want a refusal (PermissionDenied):\n%s", strings.Join(args, " "), err, out)
		}
	}
	if after, err := lbctl(false, "service", "get", "theirs", "-o", "json"); err != nil || after != before {
		t.Errorf("team-b's service after the adapter's attempts (%v):\n%s\nwant:\n%s", err, after, before)
	}
}

// toID reads a uid or gid of generic YAML.
func toID(t *testing.T, v any) uint32 {
	t.Helper()
	n, ok := normalize(v).(float64)
	if !ok || n < 0 {
		t.Fatalf("%v is not a uid or gid", v)
	}
	return uint32(n)
}

// writeTo writes a file of dir, readable by all (the adapter's user reads lbctl's
// input), and returns its path.
func writeTo(t *testing.T, dir, name, data string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
