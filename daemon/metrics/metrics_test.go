package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/daemon/gc"
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

func TestScrapeReadsCountersAndStatusEachTime(t *testing.T) {
	var packets uint64
	stats := func() (*lbdv1.GetStatsResponse, error) {
		packets += 10
		return &lbdv1.GetStatsResponse{
			Services:     []*lbdv1.ServiceStats{{ServiceName: "web", Packets: packets, Backends: []*lbdv1.BackendStats{{Address: "2001:db8::1", Port: 80, Packets: packets}}}},
			Reasons:      []*lbdv1.Counter{{Name: "lb_drop_fib", Packets: 3}},
			SocketEvents: []*lbdv1.EventCounter{{Name: "connect", Count: 7}},
		}, nil
	}
	m := New(stats, map[string]uint32{"conntrack": 1000})
	m.AddStatus(func() []*lbdv1.Service {
		return []*lbdv1.Service{{Name: "web", Status: &lbdv1.ServiceStatus{UsableBackends: 1, Advertised: true, State: lbdv1.ServiceState_SERVICE_STATE_READY},
			Backends: []*lbdv1.Backend{{Address: "2001:db8::1", Port: 80, Health: &lbdv1.BackendHealth{State: lbdv1.HealthState_HEALTH_STATE_DOWN}}}}}
	})
	m.ObserveGC(gc.Pass{Table: "conntrack", Sweep: gc.Sweep{Scanned: 500, Deleted: 100, Fill: 0.32}, Duration: time.Millisecond, Next: 5 * time.Second})
	m.ObserveReconcile(2 * time.Millisecond)
	first, second := scrape(t, m), scrape(t, m)
	for _, want := range []string{
		`lbd_service_packets_total{service="web"} 10`,
		`lbd_backend_packets_total{backend="[2001:db8::1]:80",service="web"} 10`,
		`lbd_datapath_packets_total{reason="lb_drop_fib"} 3`,
		`lbd_socket_lb_calls_total{event="connect"} 7`,
		`lbd_table_entries{table="conntrack"} 400`,
		`lbd_table_fill_ratio{table="conntrack"} 0.32`,
		`lbd_gc_passes_total{table="conntrack"} 1`,
		`lbd_gc_interval_seconds{table="conntrack"} 5`,
		`lbd_reconcile_duration_seconds_count 1`,
		`lbd_service_advertised{service="web"} 1`,
		`lbd_backend_health{backend="[2001:db8::1]:80",service="web"} 0`,
	} {
		if !strings.Contains(first, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
	if !strings.Contains(second, `lbd_service_packets_total{service="web"} 20`) {
		t.Errorf("second scrape did not read the counters again")
	}
}
