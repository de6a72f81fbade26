package lbctl

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"github.com/lbd-dev/lbd/daemon/apitest"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// parseJSON checks that out is one JSON document and decodes it with protojson.
func parseJSON(t testing.TB, out string, m proto.Message) {
	t.Helper()
	if !json.Valid([]byte(out)) {
		t.Fatalf("stdout is not one JSON document:\n%s", out)
	}
	if err := protojson.Unmarshal([]byte(out), m); err != nil {
		t.Fatalf("decode %T: %v\n%s", m, err, out)
	}
}

// parseYAML decodes YAML output into m through its JSON form.
func parseYAML(t testing.TB, out string, m proto.Message) {
	t.Helper()
	j, err := yaml.YAMLToJSON([]byte(out))
	if err != nil {
		t.Fatalf("stdout is not YAML: %v\n%s", err, out)
	}
	if err := protojson.Unmarshal(j, m); err != nil {
		t.Fatalf("decode %T: %v\n%s", m, err, out)
	}
}

// table splits a table into rows of cells, which are separated by two spaces or more, and
// checks that every column starts at the same offset on every line.
func table(t testing.TB, out string) [][]string {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	starts := columnStarts(lines[0])
	var rows [][]string
	for _, l := range lines {
		if got := columnStarts(l); fmt.Sprint(got) != fmt.Sprint(starts) {
			t.Errorf("misaligned line %q: columns at %v, header at %v\n%s", l, got, starts, out)
		}
		rows = append(rows, cellSep.Split(strings.TrimSpace(l), -1))
	}
	return rows
}

var cellSep = regexp.MustCompile(`  +`)

func columnStarts(l string) []int {
	var s []int
	for _, m := range cellSep.FindAllStringIndex(l, -1) {
		s = append(s, m[1])
	}
	return s
}

func getService(t testing.TB, srv, name string) *lbdv1.Service {
	t.Helper()
	var svc lbdv1.Service
	parseJSON(t, ok(t, srv, "service", "get", name, "-o", "json"), &svc)
	return &svc
}

func TestServiceLifecycle(t *testing.T) {
	t.Parallel()
	srv := apitest.Start(t)

	out := ok(t, srv, "service", "create", "web", "--vip", "203.0.113.10", "--port", "443",
		"--backend", "198.18.1.11:8443,weight=2", "--backend", "198.18.1.10:8443,node=198.18.0.10",
		"--backend", "198.18.1.9:8443,state=draining",
		"--health-check", "http", "--health-check-path", "/healthz", "--health-check-status", "200-299",
		"--affinity-timeout", "1h", "--source-range", "198.51.100.0/24", "--source-range", "192.0.2.0/24",
		"--hash-mode", "source-address", "--no-backend-action", "drop", "--advertise-policy", "always",
		"--maglev-table-size", "251", "--owner", "ops", "--reset-flows-on-backend-down")
	if out != "service \"web\" created\n" {
		t.Errorf("create printed %q", out)
	}
	ok(t, srv, "service", "create", "api", "--vip", "203.0.113.11", "--port", "53", "--protocol", "udp")

	svc := getService(t, srv, "web")
	want := &lbdv1.Service{
		Name: "web", Vip: "203.0.113.10", Port: 443, Protocol: lbdv1.Protocol_PROTOCOL_TCP,
		MaglevTableSize: 251, HashMode: lbdv1.HashMode_HASH_MODE_SOURCE_ADDRESS,
		NoBackendAction: lbdv1.NoBackendAction_NO_BACKEND_ACTION_DROP,
		AdvertisePolicy: lbdv1.AdvertisePolicy_ADVERTISE_POLICY_ALWAYS,
		Owner:           "ops", ResetFlowsOnBackendDown: true,
		SourceRanges: []string{"192.0.2.0/24", "198.51.100.0/24"},
	}
	got := &lbdv1.Service{
		Name: svc.Name, Vip: svc.Vip, Port: svc.Port, Protocol: svc.Protocol, MaglevTableSize: svc.MaglevTableSize,
		HashMode: svc.HashMode, NoBackendAction: svc.NoBackendAction, AdvertisePolicy: svc.AdvertisePolicy,
		Owner: svc.Owner, ResetFlowsOnBackendDown: svc.ResetFlowsOnBackendDown, SourceRanges: svc.SourceRanges,
	}
	if !proto.Equal(got, want) {
		t.Errorf("service as stored:\n got %v\nwant %v", got, want)
	}
	if d := svc.GetSessionAffinity().GetTimeout().AsDuration(); d != time.Hour {
		t.Errorf("affinity timeout %v, want 1h", d)
	}
	hc := svc.GetHealthCheck()
	if hc.GetType() != lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_HTTP || hc.GetPath() != "/healthz" ||
		hc.GetExpectedStatusMin() != 200 || hc.GetExpectedStatusMax() != 299 {
		t.Errorf("health check %v", hc)
	}
	var backends []string
	for _, b := range svc.Backends {
		backends = append(backends, fmt.Sprintf("%s:%d node=%s weight=%d %v", b.Address, b.Port, b.NodeAddress, b.Weight, b.State))
	}
	wantBackends := []string{
		"198.18.1.9:8443 node=198.18.1.9 weight=1 BACKEND_STATE_DRAINING",
		"198.18.1.10:8443 node=198.18.0.10 weight=1 BACKEND_STATE_ACTIVE",
		"198.18.1.11:8443 node=198.18.1.11 weight=2 BACKEND_STATE_ACTIVE",
	}
	if fmt.Sprint(backends) != fmt.Sprint(wantBackends) {
		t.Errorf("backends (sorted numerically):\n got %q\nwant %q", backends, wantBackends)
	}

	detail := ok(t, srv, "service", "get", "web")
	for _, line := range []string{
		"Name:                         web",
		"Port:                         443",
		"Owner:                        ops",
		"Session affinity:             client address, timeout 1h0m0s",
		"Source ranges:                192.0.2.0/24, 198.51.100.0/24",
		"No backend action:            drop",
		"Reset flows on backend down:  yes",
	} {
		if !strings.Contains(detail, line+"\n") {
			t.Errorf("service get lacks %q:\n%s", line, detail)
		}
	}
	if !strings.Contains(detail, "Health check:                 http, path /healthz, status 200-299, every 5s") {
		t.Errorf("service get shows the health check wrongly:\n%s", detail)
	}
	_, backendTable, found := strings.Cut(detail, "\n\n")
	if !found {
		t.Fatalf("service get has no backend table:\n%s", detail)
	}
	rows := table(t, backendTable)
	if len(rows) != 4 || rows[0][0] != "ADDRESS" || rows[1][0] != "198.18.1.9" || rows[2][2] != "198.18.0.10" ||
		rows[1][4] != "draining" || rows[3][3] != "2" {
		t.Errorf("backend table:\n%s", backendTable)
	}

	rows = table(t, ok(t, srv, "service", "list"))
	wantRows := [][]string{
		{"NAME", "VIP", "PORT", "PROTOCOL", "BACKENDS", "STATE", "ADVERTISED", "OWNER"},
		{"api", "203.0.113.11", "53", "udp", "0/0"},
		{"web", "203.0.113.10", "443", "tcp", "2/3"},
	}
	for i, w := range wantRows {
		if i >= len(rows) || fmt.Sprint(rows[i][:len(w)]) != fmt.Sprint(w) {
			t.Errorf("service list row %d = %v, want prefix %v", i, rows, w)
		}
	}

	var list lbdv1.ListServicesResponse
	parseJSON(t, ok(t, srv, "service", "list", "-o", "json"), &list)
	if len(list.Services) != 2 || list.Services[0].Name != "api" || list.Services[1].Name != "web" {
		t.Errorf("list -o json: %v", &list)
	}
	var ylist lbdv1.ListServicesResponse
	parseYAML(t, ok(t, srv, "service", "list", "-o", "yaml"), &ylist)
	if !proto.Equal(&list, &ylist) {
		t.Errorf("YAML and JSON differ:\n%v\n%v", &ylist, &list)
	}
	parseJSON(t, ok(t, srv, "service", "list", "--owner", "ops", "-o", "json"), &list)
	if len(list.Services) != 1 || list.Services[0].Name != "web" {
		t.Errorf("list --owner ops: %v", &list)
	}

	var created lbdv1.Service
	parseJSON(t, ok(t, srv, "service", "create", "dns6", "--vip", "2001:db8::53", "--port", "53",
		"--protocol", "udp", "--backend", "[2001:db8:1::2]:53", "-o", "json"), &created)
	if created.Name != "dns6" || created.Id == 0 || len(created.Backends) != 1 || created.Backends[0].Address != "2001:db8:1::2" {
		t.Errorf("create -o json printed %v", &created)
	}

	if out := ok(t, srv, "service", "delete", "api"); out != "service \"api\" deleted\n" {
		t.Errorf("delete printed %q", out)
	}
	var empty lbdv1.DeleteServiceResponse
	parseJSON(t, ok(t, srv, "service", "delete", "dns6", "-o", "json"), &empty)
	parseJSON(t, ok(t, srv, "service", "list", "-o", "json"), &list)
	if len(list.Services) != 1 || list.Services[0].Name != "web" {
		t.Errorf("after deletes: %v", &list)
	}
}

func TestServiceUpdateChangesOnlyGivenFlags(t *testing.T) {
	t.Parallel()
	srv := apitest.Start(t)
	ok(t, srv, "service", "create", "web", "--vip", "203.0.113.10", "--port", "443",
		"--backend", "198.18.1.10:8443", "--backend", "198.18.1.11:8443,weight=3",
		"--health-check", "https", "--health-check-path", "/healthz", "--health-check-insecure",
		"--affinity-timeout", "30m", "--source-range", "198.51.100.0/24", "--owner", "ops")
	before := getService(t, srv, "web")

	// Each step: the flags, then what they change in the service.
	steps := []struct {
		args   []string
		change func(s *lbdv1.Service)
	}{
		{[]string{"--port", "8443"}, func(s *lbdv1.Service) { s.Port = 8443 }},
		{[]string{"--hash-mode", "source-address", "--no-backend-action", "drop"}, func(s *lbdv1.Service) {
			s.HashMode = lbdv1.HashMode_HASH_MODE_SOURCE_ADDRESS
			s.NoBackendAction = lbdv1.NoBackendAction_NO_BACKEND_ACTION_DROP
		}},
		{[]string{"--affinity-timeout", "0"}, func(s *lbdv1.Service) { s.SessionAffinity = nil }},
		{[]string{"--source-range", ""}, func(s *lbdv1.Service) { s.SourceRanges = nil }},
		{[]string{"--health-check-rise", "5"}, func(s *lbdv1.Service) { s.HealthCheck.Rise = 5 }},
		// Switching to TCP drops what only HTTP(S) checks have.
		{[]string{"--health-check", "tcp"}, func(s *lbdv1.Service) {
			s.HealthCheck.Type = lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_TCP
			s.HealthCheck.Path, s.HealthCheck.ExpectedStatusMin, s.HealthCheck.ExpectedStatusMax = "", 0, 0
			s.HealthCheck.InsecureSkipVerify = false
		}},
		{[]string{"--health-check", "none"}, func(s *lbdv1.Service) { s.HealthCheck = nil }},
		{[]string{"--reset-flows-on-backend-down"}, func(s *lbdv1.Service) { s.ResetFlowsOnBackendDown = true }},
	}
	want := proto.Clone(before).(*lbdv1.Service)
	for _, step := range steps {
		args := append([]string{"service", "update", "web"}, step.args...)
		wantOut := fmt.Sprintf("service \"web\" updated (revision %d)\n", want.Revision+1)
		if out := ok(t, srv, args...); out != wantOut {
			t.Errorf("%v printed %q, want %q", step.args, out, wantOut)
		}
		step.change(want)
		want.Revision++
		got := getService(t, srv, "web")
		got.Status, want.Status = nil, nil
		if !proto.Equal(got, want) {
			t.Fatalf("after update %v:\n got %v\nwant %v", step.args, got, want)
		}
	}
}

// TestServiceUpdateConcurrent runs updates of different fields at once. Each lbctl run
// reads the service and writes it back whole; without the revision check a write based
// on a stale read would undo another's change. A run that loses the race must fail with
// FailedPrecondition, and is repeated until it succeeds.
func TestServiceUpdateConcurrent(t *testing.T) {
	t.Parallel()
	srv := apitest.Start(t)
	ok(t, srv, "service", "create", "web", "--vip", "203.0.113.10", "--port", "443")
	updates := [][]string{
		{"--hash-mode", "source-address"},
		{"--no-backend-action", "drop"},
		{"--advertise-policy", "always"},
		{"--affinity-timeout", "10s"},
		{"--maglev-table-size", "251"},
		{"--reset-flows-on-backend-down"},
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conflicts := 0
	for _, u := range updates {
		wg.Go(func() {
			for range 100 {
				r := lbctl(t, srv, append([]string{"service", "update", "web"}, u...)...)
				if r.code == ExitOK {
					return
				}
				if !strings.HasSuffix(r.stderr, "(code: FailedPrecondition)\n") || r.stdout != "" {
					t.Errorf("update %v: exit %d, stdout %q, stderr %q", u, r.code, r.stdout, r.stderr)
					return
				}
				mu.Lock()
				conflicts++
				mu.Unlock()
			}
			t.Errorf("update %v never succeeded", u)
		})
	}
	wg.Wait()
	svc := getService(t, srv, "web")
	if svc.HashMode != lbdv1.HashMode_HASH_MODE_SOURCE_ADDRESS ||
		svc.NoBackendAction != lbdv1.NoBackendAction_NO_BACKEND_ACTION_DROP ||
		svc.AdvertisePolicy != lbdv1.AdvertisePolicy_ADVERTISE_POLICY_ALWAYS ||
		svc.SessionAffinity.GetTimeout().AsDuration() != 10*time.Second ||
		svc.MaglevTableSize != 251 || !svc.ResetFlowsOnBackendDown {
		t.Errorf("an acknowledged update was lost: %v", svc)
	}
	if want := uint64(1 + len(updates)); svc.Revision != want {
		t.Errorf("revision %d, want %d (one per successful update)", svc.Revision, want)
	}
	t.Logf("%d updates, %d conflicts retried", len(updates), conflicts)
}

// TestServiceListPages: a list longer than a page comes out whole and in name order in
// every format, the same as the one response that page_size 0 asks for.
func TestServiceListPages(t *testing.T) {
	const n = 2*listPageSize + 17
	srv := servedServices(t, n)
	conn, err := grpc.NewClient(srv, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxResponseBytes)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	want, err := lbdv1.NewLoadBalancerServiceClient(conn).ListServices(context.Background(), &lbdv1.ListServicesRequest{})
	if err != nil || len(want.Services) != n {
		t.Fatalf("one-response list: %d services, %v", len(want.GetServices()), err)
	}
	for _, s := range want.Services {
		sortBackends(s.Backends)
	}
	var fromJSON, fromYAML lbdv1.ListServicesResponse
	parseJSON(t, ok(t, srv, "service", "list", "-o", "json"), &fromJSON)
	parseYAML(t, ok(t, srv, "service", "list", "-o", "yaml"), &fromYAML)
	for name, got := range map[string]*lbdv1.ListServicesResponse{"json": &fromJSON, "yaml": &fromYAML} {
		if !proto.Equal(got, want) {
			t.Errorf("-o %s: %d services, not the %d of the one-response list", name, len(got.Services), n)
		}
	}
	rows := table(t, ok(t, srv, "service", "list"))
	if len(rows) != n+1 {
		t.Fatalf("table: %d rows, want a header and %d services", len(rows), n)
	}
	for i, s := range want.Services {
		if b := fmt.Sprintf("%d/%d", s.Status.UsableBackends, len(s.Backends)); rows[i+1][0] != s.Name || rows[i+1][4] != b {
			t.Fatalf("table row %d: %v, want %s with %s backends", i+1, rows[i+1], s.Name, b)
		}
	}
}
