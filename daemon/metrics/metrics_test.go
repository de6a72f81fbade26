package metrics

import (
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/daemon/gc"
	"github.com/lbd-dev/lbd/daemon/servicematch"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// fakeStats answers as the datapath does: every service's counters, and the backends'
// of the services backendsOf selects. Each call counts 10 more packets.
type fakeStats struct {
	packets uint64
	asked   []string // services whose backends the last call asked for
}

func (f *fakeStats) read(backendsOf func(string) bool) (*lbdv1.GetStatsResponse, error) {
	f.packets += 10
	f.asked = nil
	resp := &lbdv1.GetStatsResponse{
		Reasons:      []*lbdv1.Counter{{Name: "lb_drop_fib", Packets: 3}},
		SocketEvents: []*lbdv1.EventCounter{{Name: "connect", Count: 7}},
		QuicRoutes:   []*lbdv1.EventCounter{{Name: "routed_cid", Count: 5}},
	}
	for _, name := range []string{"web", "payments/api"} {
		s := &lbdv1.ServiceStats{ServiceName: name, Packets: f.packets}
		if backendsOf != nil && backendsOf(name) {
			f.asked = append(f.asked, name)
			s.Backends = []*lbdv1.BackendStats{{Address: "2001:db8::1", Port: 80, Packets: f.packets}, {Address: "198.18.1.2", Port: 80, Packets: 1}}
		}
		resp.Services = append(resp.Services, s)
	}
	return resp, nil
}

// status answers as the store does: web is ready with one backend up and one down,
// payments/api has none usable, both its backends unknown.
func status(backendsOf func(string) bool) []store.StatusCounts {
	out := []store.StatusCounts{
		{Name: "payments/api", State: lbdv1.ServiceState_SERVICE_STATE_NO_BACKENDS, Unknown: 2},
		{Name: "web", State: lbdv1.ServiceState_SERVICE_STATE_READY, Usable: 1, Advertised: true, Up: 1, Down: 1},
	}
	health := [][]store.BackendHealth{
		{{Address: "2001:db8::1", Port: 80}, {Address: "198.18.1.2", Port: 80}},
		{{Address: "2001:db8::1", Port: 80, Health: lbdv1.HealthState_HEALTH_STATE_DOWN}, {Address: "198.18.1.2", Port: 80, Health: lbdv1.HealthState_HEALTH_STATE_UP}},
	}
	for i := range out {
		if backendsOf != nil && backendsOf(out[i].Name) {
			out[i].Backends = health[i]
		}
	}
	return out
}

func TestScrapeReadsCountersAndStatusEachTime(t *testing.T) {
	f := &fakeStats{}
	m := New(f.read, Options{LB: true, Capacities: map[string]uint32{"conntrack": 1000}})
	m.AddStatus(status)
	drained := false
	m.AddDrained(func() bool { return drained })
	m.AddBuildInfo("v1.2.3", []string{"backend", "lb"})
	m.ObserveGC(gc.Pass{Table: "conntrack", Sweep: gc.Sweep{Scanned: 500, Deleted: 100, Fill: 0.32}, Duration: time.Millisecond, Next: 5 * time.Second})
	m.ObserveReconcile(2 * time.Millisecond)
	first := scrape(t, m)
	drained = true
	second := scrape(t, m)
	for _, want := range []string{
		`lbd_service_packets_total{service="web"} 10`,
		`lbd_service_packets_total{service="payments/api"} 10`,
		`lbd_datapath_packets_total{reason="lb_drop_fib"} 3`,
		`lbd_socket_lb_calls_total{event="connect"} 7`,
		`lbd_quic_packets_total{route="routed_cid"} 5`,
		`lbd_table_entries{table="conntrack"} 400`,
		`lbd_table_fill_ratio{table="conntrack"} 0.32`,
		`lbd_gc_passes_total{table="conntrack"} 1`,
		`lbd_gc_interval_seconds{table="conntrack"} 5`,
		`lbd_reconcile_duration_seconds_count 1`,
		`lbd_service_advertised{service="web"} 1`,
		`lbd_service_ready{service="payments/api"} 0`,
		`lbd_service_backends{health="up",service="web"} 1`,
		`lbd_service_backends{health="down",service="web"} 1`,
		`lbd_service_backends{health="unknown",service="web"} 0`,
		`lbd_service_backends{health="unknown",service="payments/api"} 2`,
		`lbd_node_drained 0`,
		`lbd_services{state="ready"} 1`,
		`lbd_services{state="no_backends"} 1`,
		`lbd_services{state="pending"} 0`,
		`lbd_services{state="error"} 0`,
		`lbd_services_advertisement{state="advertised"} 1`,
		`lbd_services_advertisement{state="withdrawn"} 1`,
		`lbd_services_backends{health="up"} 1`,
		`lbd_services_backends{health="down"} 1`,
		`lbd_services_backends{health="unknown"} 2`,
		`lbd_services_usable_backends 1`,
		`lbd_services_packets_total 0`,
		`lbd_metrics_services_omitted 0`,
		`lbd_build_info{goversion="` + runtime.Version() + `",roles="lb,backend",version="v1.2.3"} 1`,
	} {
		if !strings.Contains(first, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
	if strings.Contains(first, "backend=") || len(f.asked) > 0 {
		t.Errorf("default scrape has per-backend series or read backends %v:\n%s", f.asked, grep(first, "backend="))
	}
	// Two services counted 10 more packets each since the first scrape saw them.
	for _, want := range []string{`lbd_service_packets_total{service="web"} 20`, `lbd_node_drained 1`, `lbd_services_packets_total 20`} {
		if !strings.Contains(second, want) {
			t.Errorf("second scrape lacks %s: it did not read again", want)
		}
	}
}

// TestBackendSeries: per-backend series for every service, or for the listed ones only.
func TestBackendSeries(t *testing.T) {
	listed, err := servicematch.Compile([]string{"payments/*"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		backends BackendSeries
		with     []string
		without  []string
	}{
		{"all", BackendSeries{All: true}, []string{"web", "payments/api"}, nil},
		{"listed", BackendSeries{Services: listed}, []string{"payments/api"}, []string{"web"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := &fakeStats{}
			m := New(f.read, Options{LB: true, Backends: c.backends})
			m.AddStatus(status)
			out := scrape(t, m)
			for _, svc := range c.with {
				for _, want := range []string{
					`lbd_backend_packets_total{backend="[2001:db8::1]:80",service="` + svc + `"} 10`,
					`lbd_backend_packets_total{backend="198.18.1.2:80",service="` + svc + `"} 1`,
					`lbd_backend_bytes_total{backend="198.18.1.2:80",service="` + svc + `"} 0`,
					`lbd_backend_new_flows_total{backend="198.18.1.2:80",service="` + svc + `"} 0`,
					`lbd_backend_health{backend="198.18.1.2:80",service="` + svc + `"} `,
					`lbd_backend_health{backend="[2001:db8::1]:80",service="` + svc + `"} `,
				} {
					if !strings.Contains(out, want) {
						t.Errorf("scrape lacks %s", want)
					}
				}
			}
			for _, svc := range c.without {
				if strings.Contains(out, `service="`+svc+`"`) && strings.Contains(grep(out, `service="`+svc+`"`), "backend=") {
					t.Errorf("per-backend series for %s:\n%s", svc, grep(out, `service="`+svc+`"`))
				}
			}
			if got := strings.Join(f.asked, ","); got != strings.Join(c.with, ",") {
				t.Errorf("read the backends of %q, want %q", got, strings.Join(c.with, ","))
			}
			if !strings.Contains(out, `lbd_backend_health{backend="[2001:db8::1]:80",service="web"} 0`) && c.backends.All {
				t.Error("web's down backend is not 0")
			}
		})
	}
}

func grep(text, substr string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestScrapeParses: what the handler writes, with per-backend series and a service name
// that needs escaping, is the text format that Prometheus' own parser reads back, each
// family once, with the values written; gzip-compressed when the client asks.
func TestScrapeParses(t *testing.T) {
	odd := `ns/we"b\x`
	stats := func(func(string) bool) (*lbdv1.GetStatsResponse, error) {
		return &lbdv1.GetStatsResponse{Services: []*lbdv1.ServiceStats{{ServiceName: odd, Packets: 1 << 62, Bytes: 5,
			Backends: []*lbdv1.BackendStats{{Address: "2001:db8::1", Port: 80, Packets: 4}}}},
			Reasons: []*lbdv1.Counter{{Name: "lb_drop_fib", Packets: 3}}}, nil
	}
	m := New(stats, Options{LB: true, Backends: BackendSeries{All: true}})
	m.AddStatus(func(backendsOf func(string) bool) []store.StatusCounts {
		c := store.StatusCounts{Name: odd, Unknown: 1}
		if backendsOf(odd) {
			c.Backends = []store.BackendHealth{{Address: "2001:db8::1", Port: 80}}
		}
		return []store.StatusCounts{c}
	})
	m.AddBuildInfo("v1", nil)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(scrape(t, m)))
	if err != nil {
		t.Fatalf("the scrape does not parse: %v", err)
	}
	value := func(fam string, labels ...string) float64 {
		t.Helper()
		mf := fams[fam]
		if mf == nil {
			t.Fatalf("no family %s", fam)
		}
	metric:
		for _, s := range mf.Metric {
			for i := 0; i < len(labels); i += 2 {
				found := false
				for _, l := range s.Label {
					found = found || (l.GetName() == labels[i] && l.GetValue() == labels[i+1])
				}
				if !found {
					continue metric
				}
			}
			if c := s.GetCounter(); c != nil {
				return c.GetValue()
			}
			return s.GetGauge().GetValue()
		}
		t.Fatalf("%s%v not found", fam, labels)
		return 0
	}
	if v := value("lbd_service_packets_total", "service", odd); v != 1<<62 {
		t.Errorf("packets %v", v)
	}
	if v := value("lbd_backend_packets_total", "service", odd, "backend", "[2001:db8::1]:80"); v != 4 {
		t.Errorf("backend packets %v", v)
	}
	if v := value("lbd_service_backends", "service", odd, "health", "unknown"); v != 1 {
		t.Errorf("unknown backends %v", v)
	}
	if v := value("lbd_backend_health", "service", odd); v != -1 {
		t.Errorf("backend health %v", v)
	}
	if v := value("lbd_build_info", "roles", "none"); v != 1 {
		t.Errorf("build info %v", v)
	}

	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("Content-Encoding %q, want gzip", resp.Header.Get("Content-Encoding"))
	}
	zr, err := gzip.NewReader(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if fams, err := p.TextToMetricFamilies(zr); err != nil || fams["lbd_service_packets_total"] == nil {
		t.Fatalf("gzip scrape: %v", err)
	}
}

func TestAcceptsGzip(t *testing.T) {
	for h, want := range map[string]bool{
		"gzip": true, "": false, "identity": false, "br, gzip;q=0.5": true, "gzip;q=0": false, "deflate, gzip ; q=0.0": false, "xgzip": false,
	} {
		if got := acceptsGzip(h); got != want {
			t.Errorf("acceptsGzip(%q) = %v", h, got)
		}
	}
}
