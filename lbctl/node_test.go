package lbctl

import (
	"encoding/json"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/lbd-dev/lbd/daemon/apitest"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

func TestNodeCommands(t *testing.T) {
	t.Parallel()
	srv := apitest.Start(t)
	ok(t, srv, "service", "create", "web", "--vip", "203.0.113.10", "--port", "80", "--backend", "198.18.1.10:80")

	detail := ok(t, srv, "node", "get")
	for _, line := range []string{"Drained:   no\n", "Services:  1\n", "Backends:  1\n"} {
		if !strings.Contains(detail, line) {
			t.Errorf("node get lacks %q:\n%s", line, detail)
		}
	}
	if out := ok(t, srv, "node", "drain"); !strings.HasPrefix(out, "node drained") {
		t.Errorf("drain printed %q", out)
	}
	var node lbdv1.Node
	parseJSON(t, ok(t, srv, "node", "get", "-o", "json"), &node)
	if !node.Drained || node.Services != 1 || node.StartTime == nil {
		t.Errorf("node get -o json after drain: %v", &node)
	}
	parseYAML(t, ok(t, srv, "node", "undrain", "-o", "yaml"), &node)
	if node.Drained {
		t.Errorf("node undrain -o yaml: %v", &node)
	}
	if !strings.Contains(ok(t, srv, "node", "get"), "Drained:   no\n") {
		t.Error("node still drained after undrain")
	}
}

// apitestVersion is the version apitest's server reports.
const apitestVersion = "test"

func TestVersion(t *testing.T) {
	t.Parallel()
	srv := apitest.Start(t)
	rows := table(t, ok(t, srv, "version"))
	if len(rows) != 2 || rows[0][0] != "Client:" || rows[0][1] != clientVersion() || rows[1][0] != "Server:" || rows[1][1] != apitestVersion {
		t.Errorf("version: %v", rows)
	}
	var v structpb.Struct
	parseJSON(t, ok(t, srv, "version", "-o", "json"), &v)
	if v.Fields["serverVersion"].GetStringValue() != apitestVersion || v.Fields["clientVersion"].GetStringValue() != clientVersion() {
		t.Errorf("version -o json: %v", &v)
	}
	// Without a daemon, lbctl prints its own version, says why there is no other, and
	// succeeds.
	rows = table(t, ok(t, "unix:///nonexistent/lbd.sock", "--timeout", "2s", "version"))
	if len(rows) != 2 || rows[0][1] != clientVersion() || rows[1][0] != "Server:" ||
		!strings.HasPrefix(strings.Join(rows[1][1:], " "), "unreachable (cannot reach lbd at unix:///nonexistent/lbd.sock: ") {
		t.Errorf("version without a daemon: %v", rows)
	}
	var unreachable map[string]string
	if err := json.Unmarshal([]byte(ok(t, "/nonexistent/lbd.sock", "version", "-o", "json")), &unreachable); err != nil ||
		unreachable["clientVersion"] != clientVersion() || unreachable["serverError"] == "" || len(unreachable) != 2 {
		t.Errorf("version -o json without a daemon: %v (%v)", unreachable, err)
	}
	// --client needs no server.
	out := ok(t, "unix:///nonexistent/lbd.sock", "version", "--client", "-o", "json")
	var m map[string]string
	if err := json.Unmarshal([]byte(out), &m); err != nil || len(m) != 1 || m["clientVersion"] != clientVersion() {
		t.Errorf("version --client -o json: %q (%v)", out, err)
	}
}
