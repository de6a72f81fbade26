package lbctl

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/lbd-dev/lbd/daemon/apitest"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// seed creates services of two owners and one without, with the options a file must
// carry over.
func seed(t *testing.T, srv string) {
	t.Helper()
	ok(t, srv, "service", "create", "web", "--vip", "203.0.113.10", "--port", "80",
		"--backend", "198.18.1.10:8080", "--backend", "198.18.1.11:8080,weight=3",
		"--health-check", "http", "--health-check-path", "/healthz", "--affinity-timeout", "10m",
		"--source-range", "198.51.100.0/24")
	ok(t, srv, "service", "create", "dns", "--vip", "203.0.113.10", "--port", "53", "--protocol", "udp",
		"--backend", "198.18.1.10:5353", "--owner", "ops")
	ok(t, srv, "service", "create", "k8s-a", "--vip", "203.0.113.20", "--port", "443",
		"--backend", "198.18.1.12:8443", "--owner", "k8s/cluster-1")
	ok(t, srv, "backend", "drain", "web", "198.18.1.11:8080")
}

// TestExportApplyChangesNothing: an exported file applied unchanged is a no-op, for every
// owner, and the daemon's services are exactly as before.
func TestExportApplyChangesNothing(t *testing.T) {
	srv := apitest.Start(t)
	seed(t, srv)
	before := ok(t, srv, "-o", "json", "service", "list")
	file := ok(t, srv, "export")
	for _, want := range []string{`owner: ""`, "owner: ops", "owner: k8s/cluster-1", "name: web", "path: /healthz", "state: BACKEND_STATE_DRAINING"} {
		if !strings.Contains(file, want) {
			t.Errorf("export lacks %q:\n%s", want, file)
		}
	}
	if m := regexp.MustCompile(`(?m)^\s*(- )?(id|revision|status|health|table_slots|node_reachability):`).FindString(file); m != "" {
		t.Errorf("export holds an output-only field (%q):\n%s", m, file)
	}
	r := lbctlIn(t, srv, file, "diff", "-f", "-")
	if r.code != ExitOK || strings.Contains(r.stdout, "service ") {
		t.Fatalf("diff of the export: exit %d, %s%s; want no change", r.code, r.stdout, r.stderr)
	}
	r = lbctlIn(t, srv, file, "-o", "json", "apply", "-f", "-")
	if r.code != ExitOK {
		t.Fatalf("apply of the export: exit %d: %s", r.code, r.stderr)
	}
	var resp lbdv1.ApplyServicesResponse
	if err := protojson.Unmarshal([]byte(r.stdout), &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Created+resp.Updated+resp.Deleted != 0 || resp.Unchanged != 3 || len(resp.Changes) != 0 {
		t.Errorf("apply of the export: %v; want 3 unchanged and nothing else", &resp)
	}
	if after := ok(t, srv, "-o", "json", "service", "list"); after != before {
		t.Errorf("services changed by applying their export:\nbefore %s\nafter %s", before, after)
	}
	if again := ok(t, srv, "export"); again != file {
		t.Errorf("a second export differs:\n%s\nvs\n%s", file, again)
	}
}

// TestDiffListsWhatApplyDoes: diff -f names exactly the changes (and field changes)
// that apply -f then makes, and changes nothing itself.
func TestDiffListsWhatApplyDoes(t *testing.T) {
	srv := apitest.Start(t)
	seed(t, srv)
	file := ok(t, srv, "export", "--owner", "ops")
	// ops: dns gets a second backend and a new service appears; web and k8s-a are not
	// ops' and stay.
	file = strings.Replace(file, "    backends:\n", "    backends:\n      - address: 198.18.1.13\n        port: 5353\n", 1)
	file += `  - name: api
    vip: 203.0.113.30
    port: 8443
    protocol: PROTOCOL_TCP
    backends:
      - address: 198.18.1.14
        port: 8443
`
	path := filepath.Join(t.TempDir(), "ops.yaml")
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	before := ok(t, srv, "-o", "json", "service", "list")
	diffJSON := ok(t, srv, "-o", "json", "diff", "-f", path)
	diffText := ok(t, srv, "diff", "-f", path)
	if after := ok(t, srv, "-o", "json", "service", "list"); after != before {
		t.Fatal("diff changed the services")
	}
	for _, want := range []string{
		`owner "ops": 1 to create, 1 to update, 0 to delete, 0 unchanged`,
		"+ service api", "~ service dns",
		"+ backends[198.18.1.13:5353].address: 198.18.1.13",
		"+ vip: 203.0.113.30",
	} {
		if !strings.Contains(diffText, want) {
			t.Errorf("diff lacks %q:\n%s", want, diffText)
		}
	}
	if strings.Contains(diffText, "backends[198.18.1.10:5353]") {
		t.Errorf("diff shows the unchanged backend of dns:\n%s", diffText)
	}
	applyJSON := ok(t, srv, "-o", "json", "apply", "-f", path)
	var d, a lbdv1.ApplyServicesResponse
	if err := protojson.Unmarshal([]byte(diffJSON), &d); err != nil {
		t.Fatal(err)
	}
	if err := protojson.Unmarshal([]byte(applyJSON), &a); err != nil {
		t.Fatal(err)
	}
	if len(d.Changes) != 2 || !proto.Equal(&d, &a) {
		t.Errorf("diff listed\n%v\napply made\n%v", &d, &a)
	}
	list := ok(t, srv, "service", "list")
	for _, name := range []string{"api", "dns", "web", "k8s-a"} {
		if !strings.Contains(list, name) {
			t.Errorf("service %s missing after apply:\n%s", name, list)
		}
	}
	if r := lbctl(t, srv, "diff", "-f", path); !strings.Contains(r.stdout, "0 to create, 0 to update, 0 to delete, 2 unchanged") {
		t.Errorf("diff after apply: %s", r.stdout)
	}
}

// TestApplyRemovesWhatTheFileDropped: a service the file no longer lists is deleted,
// the owner's only.
func TestApplyRemovesWhatTheFileDropped(t *testing.T) {
	srv := apitest.Start(t)
	seed(t, srv)
	out := lbctlIn(t, srv, "owner: ops\nservices: []\n", "apply", "-f", "-")
	if out.code != ExitOK || !strings.Contains(out.stdout, "- service dns") || !strings.Contains(out.stdout, "1 deleted") {
		t.Fatalf("apply of an empty ops file: exit %d %s %s", out.code, out.stdout, out.stderr)
	}
	list := ok(t, srv, "service", "list")
	if strings.Contains(list, "dns") || !strings.Contains(list, "web") || !strings.Contains(list, "k8s-a") {
		t.Errorf("services after removing ops' only service:\n%s", list)
	}
}

// TestApplyBadFileChangesNothing: a file that is wrong anywhere changes nothing, and the
// error names the document and field.
func TestApplyBadFileChangesNothing(t *testing.T) {
	srv := apitest.Start(t)
	seed(t, srv)
	before := ok(t, srv, "-o", "json", "service", "list")
	cases := []struct{ name, file, want string }{
		{"no owner", "services: []\n", `document 1: owner: missing`},
		{"unknown key", "owner: ops\nservice: []\n", `unknown key "service"`},
		{"unknown field", "owner: ops\nservices:\n  - name: x\n    vipp: 203.0.113.1\n", `services[0]`},
		{"output only", "owner: ops\nservices:\n  - name: x\n    revision: 3\n", `services[0].revision: is output only`},
		{"output only backend", "owner: ops\nservices:\n  - name: x\n    backends:\n      - address: 198.18.1.1\n        id: 4\n", `services[0].backends[0].id: is output only`},
		{"twice one owner", "owner: ops\nservices: []\n---\nowner: ops\nservices: []\n", `owner "ops" also has document 1`},
		// The second owner's document is refused by the daemon: the first, valid one
		// must not have been applied either.
		{"second owner refused", "owner: \"\"\nservices: []\n---\nowner: ops\nservices:\n  - name: x\n    vip: 203.0.113.999\n    port: 80\n",
			`owner "ops": services[0].vip`},
		{"not yaml", "owner: [\n", "document 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := lbctlIn(t, srv, c.file, "apply", "-f", "-")
			if r.code == ExitOK || !strings.Contains(r.stderr, c.want) {
				t.Errorf("exit %d, stderr %q; want a failure naming %q", r.code, r.stderr, c.want)
			}
			if after := ok(t, srv, "-o", "json", "service", "list"); after != before {
				t.Errorf("a refused apply changed the services")
			}
		})
	}
	if r := lbctl(t, srv, "apply"); r.code != ExitUsage || !strings.Contains(r.stderr, "-f FILE is required") {
		t.Errorf("apply without -f: exit %d, %q", r.code, r.stderr)
	}
	if r := lbctl(t, srv, "-o", "json", "export"); r.code != ExitUsage {
		t.Errorf("export -o json: exit %d, %q; want a usage error", r.code, r.stderr)
	}
}
