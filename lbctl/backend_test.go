package lbctl

import (
	"fmt"
	"strings"
	"testing"

	"github.com/lbd-dev/lbd/daemon/apitest"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// backendRows lists the backends as "addr port weight state" rows of the table output.
func backendRows(t testing.TB, srv, service string) []string {
	t.Helper()
	var rows []string
	for i, r := range table(t, ok(t, srv, "backend", "list", service)) {
		if i == 0 {
			if want := "[ADDRESS PORT NODE WEIGHT STATE HEALTH SLOTS SHARE]"; fmt.Sprint(r) != want {
				t.Fatalf("header %v, want %s", r, want)
			}
			continue
		}
		rows = append(rows, strings.Join([]string{r[0], r[1], r[3], r[4]}, " "))
	}
	return rows
}

func TestBackendCommands(t *testing.T) {
	t.Parallel()
	srv := apitest.Start(t)
	ok(t, srv, "service", "create", "web", "--vip", "203.0.113.10", "--port", "80")

	for _, ep := range []string{"198.18.1.10:8080", "198.18.1.2:8080", "198.18.1.2:80"} {
		if out := ok(t, srv, "backend", "add", "web", ep); out != fmt.Sprintf("backend %s added to service \"web\"\n", ep) {
			t.Errorf("add printed %q", out)
		}
	}
	var added lbdv1.Backend
	parseJSON(t, ok(t, srv, "backend", "add", "web", "198.18.1.3:80", "--weight", "4", "--node", "198.18.0.3", "--state", "draining", "-o", "json"), &added)
	if added.Address != "198.18.1.3" || added.Port != 80 || added.Weight != 4 || added.NodeAddress != "198.18.0.3" ||
		added.State != lbdv1.BackendState_BACKEND_STATE_DRAINING {
		t.Errorf("add -o json printed %v", &added)
	}
	want := []string{"198.18.1.2 80 1 active", "198.18.1.2 8080 1 active", "198.18.1.3 80 4 draining", "198.18.1.10 8080 1 active"}
	if got := backendRows(t, srv, "web"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("backend list (sorted by address, then port):\n got %q\nwant %q", got, want)
	}

	steps := []struct {
		args []string
		out  string
		row  string // the row of 198.18.1.2:8080 afterwards
	}{
		{[]string{"drain"}, "draining", "198.18.1.2 8080 1 draining"},
		{[]string{"undrain"}, "active", "198.18.1.2 8080 1 active"},
		{[]string{"disable"}, "disabled", "198.18.1.2 8080 1 disabled"},
		{[]string{"enable"}, "active", "198.18.1.2 8080 1 active"},
		{[]string{"set-weight", "", "7"}, "weight 7", "198.18.1.2 8080 7 active"},
		// The weight survives a state change: UpdateBackend replaces all three fields.
		{[]string{"drain"}, "draining", "198.18.1.2 8080 7 draining"},
	}
	for _, s := range steps {
		args := []string{"backend", s.args[0], "web", "198.18.1.2:8080"}
		args = append(args, s.args[min(2, len(s.args)):]...)
		wantOut := fmt.Sprintf("backend 198.18.1.2:8080 of service \"web\": %s\n", s.out)
		if out := ok(t, srv, args...); out != wantOut {
			t.Errorf("%v printed %q, want %q", args, out, wantOut)
		}
		if got := backendRows(t, srv, "web")[1]; got != s.row {
			t.Errorf("after %v: row %q, want %q", args, got, s.row)
		}
	}
	// A draining backend is not "enabled", a disabled one is not "undrained".
	r := lbctl(t, srv, "backend", "enable", "web", "198.18.1.2:8080")
	if r.code != ExitError || r.stdout != "" || !strings.Contains(r.stderr, "is draining: 'enable' does not apply") {
		t.Errorf("enable of a draining backend: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	ok(t, srv, "backend", "disable", "web", "198.18.1.2:8080")
	r = lbctl(t, srv, "backend", "undrain", "web", "198.18.1.2:8080")
	if r.code != ExitError || r.stdout != "" || !strings.Contains(r.stderr, "is disabled: 'undrain' does not apply") {
		t.Errorf("undrain of a disabled backend: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}

	var updated lbdv1.Backend
	var list0 lbdv1.ListBackendsResponse
	parseJSON(t, ok(t, srv, "backend", "set-weight", "web", "198.18.1.10:8080", "3", "-o", "json"), &updated)
	if updated.Address != "198.18.1.10" || updated.Weight != 3 {
		t.Errorf("set-weight -o json printed %v", &updated)
	}
	// Weight 0 is refused by lbd, naming the field; the weight stays 3.
	r = lbctl(t, srv, "backend", "set-weight", "web", "198.18.1.10:8080", "0")
	if r.code != ExitError || r.stdout != "" ||
		r.stderr != "lbctl: backend.weight: 0 is not a weight (1-256); to send a backend no new flows, drain it (state DRAINING) (code: InvalidArgument)\n" {
		t.Errorf("set-weight 0: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	parseJSON(t, ok(t, srv, "backend", "list", "web", "-o", "json"), &list0)
	for _, b := range list0.Backends {
		if b.Address == "198.18.1.10" && b.Weight != 3 {
			t.Errorf("set-weight 0 changed the weight to %d", b.Weight)
		}
	}
	if out := ok(t, srv, "backend", "remove", "web", "198.18.1.2:80"); out != "backend 198.18.1.2:80 removed from service \"web\"\n" {
		t.Errorf("remove printed %q", out)
	}
	var list lbdv1.ListBackendsResponse
	parseYAML(t, ok(t, srv, "backend", "list", "web", "-o", "yaml"), &list)
	if len(list.Backends) != 3 || list.Backends[0].Port != 8080 || list.Backends[0].State != lbdv1.BackendState_BACKEND_STATE_DISABLED {
		t.Errorf("backend list -o yaml after remove: %v", &list)
	}
	r = lbctl(t, srv, "backend", "remove", "web", "198.18.1.2:80")
	if r.code != ExitError || r.stdout != "" || !strings.HasSuffix(r.stderr, "(code: NotFound)\n") {
		t.Errorf("second remove: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

func TestBackendIPv6(t *testing.T) {
	t.Parallel()
	srv := apitest.Start(t)
	ok(t, srv, "service", "create", "web6", "--vip", "2001:db8::10", "--port", "443")
	ok(t, srv, "backend", "add", "web6", "[2001:db8:1::10]:8443", "--node", "198.18.1.10")
	ok(t, srv, "backend", "add", "web6", "[2001:db8:1::9]:8443")
	if out := ok(t, srv, "backend", "drain", "web6", "[2001:db8:1::10]:8443"); out != "backend [2001:db8:1::10]:8443 of service \"web6\": draining\n" {
		t.Errorf("drain printed %q", out)
	}
	rows := table(t, ok(t, srv, "backend", "list", "web6"))
	if len(rows) != 3 || rows[1][0] != "2001:db8:1::9" || rows[2][0] != "2001:db8:1::10" || rows[2][2] != "198.18.1.10" || rows[2][4] != "draining" {
		t.Errorf("backend list:\n%v", rows)
	}
	ok(t, srv, "backend", "remove", "web6", "[2001:db8:1::9]:8443")
	if rows := table(t, ok(t, srv, "backend", "list", "web6")); len(rows) != 2 {
		t.Errorf("after remove: %v", rows)
	}
}

// TestBackendEditsKeepConcurrentChanges: one client changes a backend's weight while
// another drains and undrains it. Each command writes only its own field, on the
// revision it read, so when both are done the backend has the last weight and the last
// state set: neither client's change was overwritten with what the other had read.
func TestBackendEditsKeepConcurrentChanges(t *testing.T) {
	t.Parallel()
	srv := apitest.Start(t)
	ok(t, srv, "service", "create", "web", "--vip", "203.0.113.10", "--port", "80", "--backend", "198.18.1.1:8080")
	const n = 40
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range n {
			verb := "drain"
			if i%2 == 1 {
				verb = "undrain"
			}
			if r := lbctl(t, srv, "backend", verb, "web", "198.18.1.1:8080"); r.code != ExitOK {
				t.Errorf("backend %s: exit %d: %s", verb, r.code, r.stderr)
				return
			}
		}
	}()
	for w := 2; w <= n+1; w++ {
		if r := lbctl(t, srv, "backend", "set-weight", "web", "198.18.1.1:8080", fmt.Sprint(w)); r.code != ExitOK {
			t.Fatalf("set-weight %d: exit %d: %s", w, r.code, r.stderr)
		}
	}
	<-done
	if got, want := backendRows(t, srv, "web"), []string{fmt.Sprintf("198.18.1.1 8080 %d active", n+1)}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after concurrent edits: %v, want %v", got, want)
	}
}
