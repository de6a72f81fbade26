//go:build linux

package datapath

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/lbd-dev/lbd/daemon/model/modeltest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/internal/testnet"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// testCgroup creates a cgroup v2 directory for one test; it is removed at cleanup.
func testCgroup(t *testing.T, name string) string {
	t.Helper()
	root, err := CgroupRoot()
	if err != nil {
		t.Skipf("needs a cgroup v2 hierarchy: %v", err)
	}
	dir := filepath.Join(root, "lbd-dp-"+name+"-"+testnet.Suffix(t))
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

// cgroupPrograms returns the attach types of the programs attached to a cgroup, as the
// kernel reports them (bpftool).
func cgroupPrograms(t *testing.T, dir string) []string {
	t.Helper()
	out, err := exec.Command("bpftool", "-j", "cgroup", "show", dir).Output()
	if err != nil {
		t.Fatalf("bpftool cgroup show %s: %v", dir, err)
	}
	var progs []struct {
		AttachType string `json:"attach_type"`
	}
	if len(strings.TrimSpace(string(out))) > 0 {
		if err := json.Unmarshal(out, &progs); err != nil {
			t.Fatalf("bpftool output %q: %v", out, err)
		}
	}
	var types []string
	for _, p := range progs {
		types = append(types, p.AttachType)
	}
	return types
}

// TestSocketLBLifecycle: socket-level load balancing on a node without a role attaches
// its nine hooks to the configured cgroup; a restart adopts them (still nine); a new
// cgroup moves them; turning it off detaches them; Detach removes everything.
func TestSocketLBLifecycle(t *testing.T) {
	testnet.Require(t, "bpftool")
	n := newNode(t)
	a, b := testCgroup(t, "a"), testCgroup(t, "b")
	cfg := n.config(1024)
	cfg.LB, cfg.Interfaces = false, nil
	cfg.SocketLB, cfg.SocketCgroup = true, a

	m := n.open(t, cfg)
	if got := cgroupPrograms(t, a); len(got) != 9 {
		t.Fatalf("cgroup a has programs %v, want the 9 hooks", got)
	}
	if links, _ := os.ReadDir(cfg.linksDir()); len(links) != 9 {
		t.Errorf("%d pinned links, want 9 (no XDP link without the lb role)", len(links))
	}
	// The services reach the LB maps the hooks read, and the translations list answers.
	if _, err := m.Upsert(context.Background(), modeltest.Of(service(1, "web", "203.0.113.10", 80, 251, backend(1, "198.18.0.5", 8080, active)))); err != nil {
		t.Fatal(err)
	}
	if tab, err := m.lb.MaglevTable(1); err != nil || len(tab) != 251 {
		t.Errorf("maglev table of the service: %v, %v", tab, err)
	}
	if _, err := m.ListSocketTranslations(context.Background(), &lbdv1.ListSocketTranslationsRequest{}); err != nil {
		t.Errorf("list socket translations: %v", err)
	}
	m.Close()

	m = n.open(t, cfg)
	if got := cgroupPrograms(t, a); len(got) != 9 {
		t.Fatalf("after a restart cgroup a has programs %v, want the same 9 hooks", got)
	}
	m.Close()

	cfg.SocketCgroup = b
	m = n.open(t, cfg)
	if got := cgroupPrograms(t, a); len(got) != 0 {
		t.Errorf("cgroup a keeps programs %v after the cgroup changed", got)
	}
	if got := cgroupPrograms(t, b); len(got) != 9 {
		t.Errorf("cgroup b has programs %v, want the 9 hooks", got)
	}
	m.Close()

	off := n.config(1024)
	m = n.open(t, off)
	if got := cgroupPrograms(t, b); len(got) != 0 {
		t.Errorf("cgroup b keeps programs %v with socket-level load balancing off", got)
	}
	_, err := m.ListSocketTranslations(context.Background(), &lbdv1.ListSocketTranslationsRequest{})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("list socket translations with it off: %v, want FailedPrecondition", err)
	}
	m.Close()

	// A node without a role opens no Manager: lbd removes the hooks directly.
	m = n.open(t, cfg)
	m.Close()
	if got := cgroupPrograms(t, b); len(got) != 9 {
		t.Fatalf("cgroup b has programs %v, want the 9 hooks", got)
	}
	if err := DetachSocketLB(cfg.BPFFSDir, hclog.NewNullLogger()); err != nil {
		t.Fatal(err)
	}
	if got := cgroupPrograms(t, b); len(got) != 0 {
		t.Errorf("cgroup b keeps programs %v after DetachSocketLB", got)
	}

	m = n.open(t, cfg)
	if err := m.Detach(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := cgroupPrograms(t, b); len(got) != 0 {
		t.Errorf("cgroup b keeps programs %v after Detach", got)
	}
}
