package examplestest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/lbd-dev/lbd/daemon/advertise"
	"github.com/lbd-dev/lbd/daemon/config"
	"github.com/lbd-dev/lbd/daemon/datapath"
	"github.com/lbd-dev/lbd/daemon/gc"
	"github.com/lbd-dev/lbd/daemon/metrics"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"
)

// TestPrometheusConfig checks the scrape configuration with promtool (which loads the
// rule files it names) and that every target uses lbd's default metrics port.
func TestPrometheusConfig(t *testing.T) {
	var prom struct {
		Global        map[string]string `json:"global"`
		RuleFiles     []string          `json:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `json:"job_name"`
			StaticConfigs []struct {
				Targets []string          `json:"targets"`
				Labels  map[string]string `json:"labels"`
			} `json:"static_configs"`
		} `json:"scrape_configs"`
	}
	if err := yaml.UnmarshalStrict([]byte(readFile(t, "examples", "prometheus", "prometheus.yml")), &prom); err != nil {
		t.Fatalf("prometheus.yml: %v", err)
	}
	_, wantPort, err := net.SplitHostPort(config.Default().MetricsListen)
	if err != nil {
		t.Fatal(err)
	}
	targets := 0
	for _, sc := range prom.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				targets++
				if _, port, err := net.SplitHostPort(target); err != nil || port != wantPort {
					t.Errorf("job %s: target %q is not host:%s (lbd's default metrics_listen)", sc.JobName, target, wantPort)
				}
			}
		}
		if !strings.HasPrefix(sc.JobName, "lbd") {
			t.Errorf("job %s: the alert LbdDown watches jobs named lbd*", sc.JobName)
		}
	}
	if targets == 0 {
		t.Error("prometheus.yml scrapes nothing")
	}
	if !slices.Contains(prom.RuleFiles, "lbd-alerts.yml") {
		t.Errorf("prometheus.yml does not load lbd-alerts.yml: rule_files %v", prom.RuleFiles)
	}
	promtool(t, "check", "config", "prometheus.yml")
}

// TestPrometheusRules checks the alert rules with promtool, runs their unit tests, and
// checks that they use only series and label values lbd exports by default.
func TestPrometheusRules(t *testing.T) {
	// lbd-alerts.yml works on every node: it uses only what a node above the service
	// limit exports. lbd-service-alerts.yml names services where they have series.
	for _, f := range []struct {
		rules, tests string
		services     int
		min          int
	}{
		{"lbd-alerts.yml", "lbd-alerts.test.yml", largeNode, 12},
		{"lbd-service-alerts.yml", "lbd-service-alerts.test.yml", smallNode, 4},
	} {
		promtool(t, "check", "rules", f.rules)
		promtool(t, "test", "rules", f.tests)
		var rules struct {
			Groups []struct {
				Rules []struct {
					Alert string `json:"alert"`
					Expr  string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		}
		if err := yaml.Unmarshal([]byte(readFile(t, "examples", "prometheus", f.rules)), &rules); err != nil {
			t.Fatal(err)
		}
		def := defaultSeries(t, f.services)
		n := 0
		for _, g := range rules.Groups {
			for _, r := range g.Rules {
				n++
				checkQuery(t, f.rules+": alert "+r.Alert, r.Expr, def)
			}
		}
		if n < f.min {
			t.Errorf("%s: %d alert rules", f.rules, n)
		}
	}
}

// promtool runs promtool in examples/prometheus and fails the test on an error.
func promtool(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command(needTool(t, "promtool"), args...)
	cmd.Dir = path("examples", "prometheus")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// A node of one service exports every per-service series by default; a node of more
// than metrics.service_series_limit services only the node-level ones.
var (
	smallNode = 1
	largeNode = config.Default().Metrics.ServiceSeriesLimit + 1
)

// defaultSeries scrapes lbd's metrics as a node with every source builds them (LB and
// backend datapath counters, services, BGP, tables) with the default configuration and
// the given number of services, and returns the label values of each family: a query
// that needs anything else needs a series lbd does not export by default.
func defaultSeries(t *testing.T, services int) map[string]map[string][]string {
	t.Helper()
	var reasons []*lbdv1.Counter
	for _, r := range datapathReasons(t) {
		reasons = append(reasons, &lbdv1.Counter{Name: r})
	}
	var ctEvents []*lbdv1.EventCounter
	for _, e := range []string{"inserted", "tentative", "confirmed", "guard_skipped", "guard_engaged", "insert_failed", "reclaimed"} {
		ctEvents = append(ctEvents, &lbdv1.EventCounter{Name: e})
	}
	names := []string{"web"}
	for i := 1; i < services; i++ {
		names = append(names, fmt.Sprintf("svc-%d", i))
	}
	stats := func(func(string) bool) (*lbdv1.GetStatsResponse, error) {
		resp := &lbdv1.GetStatsResponse{Reasons: reasons, ConntrackEvents: ctEvents, SocketEvents: []*lbdv1.EventCounter{{Name: "connect"}}}
		for _, n := range names {
			resp.Services = append(resp.Services, &lbdv1.ServiceStats{ServiceName: n, Backends: []*lbdv1.BackendStats{{Address: "198.18.1.10", Port: 80}}})
		}
		return resp, nil
	}
	def := config.Default().Metrics
	m := metrics.New(stats, metrics.Options{LB: true, Capacities: map[string]uint32{"conntrack": 1 << 20, "nat": 1 << 18},
		Services: metrics.ServiceSeries{Limit: def.ServiceSeriesLimit}})
	m.AddStatus(func(func(string) bool) []store.StatusCounts {
		var out []store.StatusCounts
		for _, n := range names {
			out = append(out, store.StatusCounts{Name: n, Up: 1})
		}
		return out
	})
	m.SetReady(func() (bool, string) { return true, "ready" })
	m.AddDrift(func() map[string]uint64 { return map[string]uint64{"maglev_table": 1} })
	m.AddDrained(func() bool { return false })
	m.AddBuildInfo("test", []string{"lb"})
	m.AddFleet(func() (int, bool) { return 0, true }) // a node on the etcd store
	m.AddBGP(func(context.Context) (advertise.Metrics, error) {
		return advertise.Metrics{Running: true, Peers: []advertise.PeerMetrics{{Address: "198.18.0.254", AS: 65000, State: "established", Established: true}}}, nil
	})
	for _, table := range []string{"conntrack", "nat"} {
		m.ObserveGC(gc.Pass{Table: table, Duration: time.Millisecond, Next: time.Second})
	}
	m.ObserveReconcile(time.Millisecond)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string][]string{}
	for name, mf := range fams {
		labels := map[string][]string{}
		for _, s := range mf.Metric {
			for _, l := range s.Label {
				labels[l.GetName()] = append(labels[l.GetName()], l.GetValue())
			}
		}
		out[name] = labels
	}
	// A sanity floor, and the families that must stay out of the default.
	for _, n := range []string{"lbd_services", "lbd_services_backends", "lbd_services_new_flows_total", "lbd_build_info", "lbd_bgp_session_established"} {
		if out[n] == nil {
			t.Fatalf("the default scrape lacks %s", n)
		}
	}
	for n := range out {
		if strings.HasPrefix(n, "lbd_backend_") {
			t.Fatalf("the default scrape has %s", n)
		}
	}
	if (out["lbd_service_packets_total"] != nil) != (services <= def.ServiceSeriesLimit) {
		t.Fatalf("the default scrape of %d services: per-service series %v, limit %d", services, out["lbd_service_packets_total"] != nil, def.ServiceSeriesLimit)
	}
	return out
}

var (
	nameRE = regexp.MustCompile(`\blbd_[a-z0-9_]+`)
	// matcherRE finds label matchers: name, operator, value.
	matcherRE = regexp.MustCompile(`([a-z_]+)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
)

// checkQuery fails if query uses an lbd series the default scrape lacks, or matches a
// label of one with a value (or regular expression) that none of its series has.
func checkQuery(t *testing.T, what, query string, def map[string]map[string][]string) {
	t.Helper()
	names := nameRE.FindAllString(query, -1)
	if len(names) == 0 && !regexp.MustCompile(`^up\{`).MatchString(query) {
		t.Errorf("%s: %q uses no lbd series (nor Prometheus' up)", what, query)
	}
	for _, n := range names {
		base := n
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(n, suffix); ok && def[b] != nil {
				base = b
			}
		}
		if def[base] == nil && def[n] == nil {
			t.Errorf("%s: %s is not among the series lbd exports by default", what, n)
		}
	}
	for _, m := range matcherRE.FindAllStringSubmatch(query, -1) {
		label, op, value := m[1], m[2], m[3]
		if strings.Contains(value, "$") || op == "!=" || op == "!~" || label == "job" || label == "instance" {
			continue // dashboard variables, and labels Prometheus adds
		}
		var values []string
		for _, fam := range names {
			values = append(values, def[fam][label]...)
		}
		if len(values) == 0 {
			t.Errorf("%s: no default series of %v has a label %s", what, names, label)
			continue
		}
		for _, alt := range alternatives(value) {
			re, err := regexp.Compile("^(?:" + alt + ")$")
			if err != nil {
				t.Fatalf("%s: %s=%q: %v", what, label, alt, err)
			}
			if op == "=" && !slices.Contains(values, alt) || op == "=~" && !slices.ContainsFunc(values, re.MatchString) {
				t.Errorf("%s: %s%s%q matches none of %v", what, label, op, alt, values)
			}
		}
	}
}

// alternatives splits a regular expression at its top-level |: a|b(c|d) is a, b(c|d).
func alternatives(re string) []string {
	var out []string
	depth, start := 0, 0
	for i, c := range re {
		switch c {
		case '(':
			depth++
		case ')':
			depth--
		case '|':
			if depth == 0 {
				out = append(out, re[start:i])
				start = i + 1
			}
		}
	}
	return append(out, re[start:])
}

// datapathReasons returns the reason label values of lbd_datapath_packets_total, as
// daemon/datapath names them.
func datapathReasons(t *testing.T) []string {
	t.Helper()
	out := datapath.PacketReasons()
	if len(out) == 0 {
		t.Fatal("daemon/datapath names no reason")
	}
	return out
}

// TestGrafanaDashboard loads the dashboard with Grafana's dashboard schema (strictly:
// unknown or missing fields are errors), checks its job, role and node (instance)
// variables and that every query filters on them, and that every query uses only
// series and label values lbd exports by default.
func TestGrafanaDashboard(t *testing.T) {
	raw := []byte(readFile(t, "examples", "prometheus", "grafana-dashboard.json"))
	plugins.RegisterDefaultPlugins()
	// The dashboard is in the JSON model Grafana imports (schemaVersion 39), which is
	// this package's; dashboardv2 is another, newer model.
	//lint:ignore SA1019 the classic dashboard model is the one the file is written in
	var schema dashboard.Dashboard
	err := schema.UnmarshalJSONStrict(raw)
	var build cog.BuildErrors
	if errors.As(err, &build) && len(build) == 0 {
		err = nil // the schema's decoder returns its error list even when it is empty
	}
	if err != nil {
		t.Fatalf("grafana-dashboard.json does not load with Grafana's dashboard schema:\n%v", err)
	}
	if err := schema.Validate(); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	// The schema's decoder keeps no panel it decoded without error (the same empty
	// error list): the queries are read on their own.
	var d struct {
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Query != nil
	}
	for _, name := range []string{"datasource", "job", "role", "instance"} {
		if !vars[name] {
			t.Errorf("the dashboard has no %s variable with a query", name)
		}
	}
	// The panels of a row "(where lbd exports per-service series)" may use them; every
	// other panel works on a node above the service limit.
	large, small := defaultSeries(t, largeNode), defaultSeries(t, smallNode)
	def, perServiceRows := large, 0
	queries := 0
	selRE := regexp.MustCompile(`\blbd_[a-z0-9_]+(\{[^}]*\})?`)
	for _, p := range d.Panels {
		if p.Type == "row" {
			def = large
			if strings.Contains(p.Title, "(where lbd exports per-service series") {
				def = small
				perServiceRows++
			}
		}
		for _, tg := range p.Targets {
			queries++
			checkQuery(t, "panel "+p.Title, tg.Expr, def)
			for _, sel := range selRE.FindAllStringSubmatch(tg.Expr, -1) {
				if !strings.Contains(sel[1], `instance=~"$instance"`) {
					t.Errorf("panel %q: %s does not filter on the node variable ($instance)", p.Title, sel[0])
				}
			}
		}
	}
	if queries < 15 {
		t.Errorf("the dashboard has %d queries", queries)
	}
	if perServiceRows > 2 {
		t.Errorf("%d rows of per-service panels: most of the dashboard must work on every node", perServiceRows)
	}
}
