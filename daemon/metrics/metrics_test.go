package metrics

import (
	"io"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/daemon/gc"
	"github.com/lbd-dev/lbd/daemon/servicematch"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
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

func services() []*lbdv1.Service {
	be := func(addr string, h lbdv1.HealthState) *lbdv1.Backend {
		return &lbdv1.Backend{Address: addr, Port: 80, Health: &lbdv1.BackendHealth{State: h}}
	}
	return []*lbdv1.Service{
		{Name: "web", Status: &lbdv1.ServiceStatus{UsableBackends: 1, Advertised: true, State: lbdv1.ServiceState_SERVICE_STATE_READY},
			Backends: []*lbdv1.Backend{be("2001:db8::1", lbdv1.HealthState_HEALTH_STATE_DOWN), be("198.18.1.2", lbdv1.HealthState_HEALTH_STATE_UP)}},
		{Name: "payments/api", Status: &lbdv1.ServiceStatus{State: lbdv1.ServiceState_SERVICE_STATE_NO_BACKENDS},
			Backends: []*lbdv1.Backend{be("2001:db8::1", lbdv1.HealthState_HEALTH_STATE_UNSPECIFIED), {Address: "198.18.1.2", Port: 80}}},
	}
}

func TestScrapeReadsCountersAndStatusEachTime(t *testing.T) {
	f := &fakeStats{}
	m := New(f.read, map[string]uint32{"conntrack": 1000}, BackendSeries{})
	m.AddStatus(services)
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
		`lbd_build_info{goversion="` + runtime.Version() + `",roles="lb,backend",version="v1.2.3"} 1`,
	} {
		if !strings.Contains(first, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
	if strings.Contains(first, "backend=") || len(f.asked) > 0 {
		t.Errorf("default scrape has per-backend series or read backends %v:\n%s", f.asked, grep(first, "backend="))
	}
	for _, want := range []string{`lbd_service_packets_total{service="web"} 20`, `lbd_node_drained 1`} {
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
			m := New(f.read, nil, c.backends)
			m.AddStatus(services)
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
