package lbctl

import (
	"strings"
	"sync"
	"testing"

	"github.com/lbd-dev/lbd/daemon/api"
	"github.com/lbd-dev/lbd/daemon/apitest"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/encoding/protojson"
)

// fakeTables stands for a datapath's table digests: one per name, as set.
type fakeTables struct {
	mu     sync.Mutex
	tables map[string]string
}

func (f *fakeTables) TableDigests() (map[string]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]string{}
	for k, v := range f.tables {
		out[k] = v
	}
	return out, nil
}

func (f *fakeTables) set(name, digest string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tables[name] = digest
}

// fleetNode serves the API with fake table digests for web and dns, and creates those
// services.
func fleetNode(t *testing.T) (string, *fakeTables) {
	tables := &fakeTables{tables: map[string]string{"web": "00aa", "dns": "00bb"}}
	srv := apitest.StartWithOptions(t, store.DefaultLimits(), api.Options{Tables: tables}).Addr
	ok(t, srv, "service", "create", "web", "--vip", "203.0.113.10", "--port", "80", "--backend", "198.18.1.10:8080")
	ok(t, srv, "service", "create", "dns", "--vip", "203.0.113.10", "--port", "53", "--protocol", "udp", "--backend", "198.18.1.10:5353")
	return srv, tables
}

// TestFleetCheck: nodes that agree pass; a node whose table or desired state differs,
// or that lacks a service, is reported with the service, and the check exits with 1.
func TestFleetCheck(t *testing.T) {
	a, _ := fleetNode(t)
	b, bTables := fleetNode(t)
	out := ok(t, "", "fleet", "check", "-s", a, "-s", b)
	if !strings.Contains(out, "every service has the same digests on the 2 nodes") {
		t.Fatalf("agreeing nodes:\n%s", out)
	}

	bTables.set("web", "ffff")
	r := lbctl(t, "", "fleet", "check", "-s", a, "-s", b)
	if r.code != ExitError || !strings.Contains(r.stderr, "1 service(s) differ between the nodes: web") {
		t.Fatalf("a differing table: exit %d, stderr %q", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "web") || !strings.Contains(r.stdout, "ffff") || strings.Contains(r.stdout, "dns ") {
		t.Errorf("report of a differing table:\n%s", r.stdout)
	}
	bTables.set("web", "00aa")

	// A changed spec differs even where the table is the same.
	ok(t, b, "backend", "set-weight", "dns", "198.18.1.10:5353", "2")
	// A service only one node has.
	ok(t, a, "service", "create", "extra", "--vip", "203.0.113.11", "--port", "80", "--backend", "198.18.1.11:80")
	r = lbctl(t, "", "-o", "json", "fleet", "check", "-s", a, "-s", b)
	if r.code != ExitError {
		t.Fatalf("exit %d, want %d: %s", r.code, ExitError, r.stderr)
	}
	var resp lbdv1.GetFleetResponse
	if err := protojson.Unmarshal([]byte(r.stdout), &resp); err != nil {
		t.Fatalf("decode: %v: %s", err, r.stdout)
	}
	var names []string
	for _, d := range resp.Diverged {
		names = append(names, d.Name)
		if d.Name == "extra" && (d.Digests[1].Digest.GetSpec() != "" || d.Digests[0].Digest.GetSpec() == "") {
			t.Errorf("extra: the node without it must show an empty digest: %v", d)
		}
	}
	if strings.Join(names, ",") != "dns,extra" {
		t.Errorf("diverged %v, want [dns extra]", names)
	}

	if r := lbctl(t, "", "fleet", "check", "-s", a); r.code != ExitUsage {
		t.Errorf("one node: exit %d, want a usage error", r.code)
	}
	plain := apitest.Start(t) // a node that programs no services
	if r := lbctl(t, "", "fleet", "check", "-s", a, "-s", plain); r.code != ExitError || !strings.Contains(r.stderr, "node "+plain) ||
		!strings.Contains(r.stderr, "FailedPrecondition") {
		t.Errorf("a node without digests: exit %d, %q", r.code, r.stderr)
	}
}

// TestFleetStatusFileStore: with the file store there is no fleet, and the error says
// what to use instead.
func TestFleetStatusFileStore(t *testing.T) {
	srv := apitest.Start(t)
	r := lbctl(t, srv, "fleet", "status")
	if r.code != ExitError || !strings.Contains(r.stderr, "lbctl fleet check") {
		t.Errorf("fleet status on a file store: exit %d, %q", r.code, r.stderr)
	}
}
