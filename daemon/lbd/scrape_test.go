//go:build linux

package lbd

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/bpf/lbxdp"
	"github.com/lbd-dev/lbd/daemon/config"
	"github.com/lbd-dev/lbd/daemon/datapath"
	"github.com/lbd-dev/lbd/daemon/reconcile"
	"github.com/lbd-dev/lbd/daemon/store"
	"github.com/lbd-dev/lbd/internal/testnet"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// scaleNode is an LB node's daemon parts at scale: a store holding services with per
// backends each, programmed into a real datapath by the reconciler, and counters in
// the BPF maps as traffic would leave them. Metrics are built from it as lbd builds
// them (newMetrics).
type scaleNode struct {
	cfg  config.Config
	st   *store.Store
	mgr  *datapath.Manager
	svcs []*lbdv1.Service // as stored, with their IDs
}

// scaleName names service i; backends are 198.18.(10+j).(i%250+1):(8000+i/250).
func scaleName(i int) string { return fmt.Sprintf("svc-%05d", i) }

func newScaleNode(tb testing.TB, services, per int) *scaleNode {
	tb.Helper()
	sfx := testnet.Suffix(tb)
	ns := testnet.NewNS(tb, "scr-"+sfx)
	up, peer := "sca"+sfx, "scb"+sfx
	testnet.Veth(tb, testnet.VethEnd{NS: ns, Name: up}, testnet.VethEnd{NS: ns, Name: peer})
	ns.AddAddr(tb, up, netip.MustParsePrefix("198.18.0.1/24"))
	ns.IP(tb, "neigh add 198.18.0.2 lladdr 02:00:00:00:00:02 dev "+up+" nud permanent",
		"route add 198.18.0.0/16 via 198.18.0.2 dev "+up)
	ns.Sysctl(tb, "net.ipv4.conf.all.forwarding=1")

	cfg := config.Default()
	cfg.Roles = []string{config.RoleLB}
	cfg.StateDir = tb.TempDir()
	cfg.Datapath.Interfaces = []string{up}
	cfg.Datapath.BPFFSDir = testnet.MountDir(tb)
	cfg.Datapath.ConntrackSize, cfg.Datapath.NATSize = 1<<16, 1024
	cfg.Limits.MaxServices, cfg.Limits.MaxBackends = services+1, services*per+1
	cfg.Limits.DefaultTableSize = 251
	if err := cfg.Validate(); err != nil {
		tb.Fatal(err)
	}
	n := &scaleNode{cfg: cfg}
	st, err := store.Open(store.Options{Limits: cfg.Limits, HoldIDs: true})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	n.st = st
	var svcs []*lbdv1.Service
	for i := range services {
		s := &lbdv1.Service{Name: scaleName(i), Vip: fmt.Sprintf("203.0.113.%d", i%250+1), Port: uint32(1000 + i/250),
			Protocol: lbdv1.Protocol_PROTOCOL_TCP}
		for j := range per {
			a := fmt.Sprintf("198.18.%d.%d", 10+j, i%250+1)
			s.Backends = append(s.Backends, &lbdv1.Backend{Address: a, Port: uint32(8000 + i/250), NodeAddress: a, Weight: 1})
		}
		svcs = append(svcs, s)
	}
	if _, err := st.ApplyServices("scale", svcs); err != nil {
		tb.Fatal(err)
	}
	dcfg, err := datapathConfig(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ns.Do(tb, func() { n.mgr, err = datapath.Open(dcfg, hclog.NewNullLogger()) })
	if err != nil {
		tb.Fatalf("open datapath: %+v", err)
	}
	tb.Cleanup(func() { n.mgr.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- reconcile.New(st, n.mgr, hclog.NewNullLogger()).Run(ctx) }()
	tb.Cleanup(func() { cancel(); <-done })
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		n.svcs = st.ListServices("")
		ready := 0
		for _, s := range n.svcs {
			if s.Status.GetState() == lbdv1.ServiceState_SERVICE_STATE_READY {
				ready++
			}
		}
		if ready == services {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%d of %d services ready after 5 minutes", ready, services)
		}
	}
	n.fillCounters(tb)
	return n
}

// fillCounters writes counters of the size a busy node has into every service's and
// backend's entry (a scrape's size depends on the numbers' digits).
func (n *scaleNode) fillCounters(tb testing.TB) {
	tb.Helper()
	svcIDs, beIDs := map[uint32]uint64{}, map[uint32]uint64{}
	for _, s := range n.svcs {
		svcIDs[s.Id] = 1e8 + uint64(s.Id)*7919
		for _, b := range s.Backends {
			beIDs[b.Id] = 1e7 + uint64(b.Id)*7919
		}
	}
	for name, values := range map[string]map[uint32]uint64{lbxdp.MapServiceStats: svcIDs, lbxdp.MapBackendStats: beIDs} {
		m, err := ebpf.LoadPinnedMap(filepath.Join(n.cfg.Datapath.BPFFSDir, "lb", name), nil)
		if err != nil {
			tb.Fatal(err)
		}
		ncpu := ebpf.MustPossibleCPU()
		keys := make([]uint32, 0, len(values))
		vals := make([]struct{ Packets, Bytes, NewFlows uint64 }, 0, len(values)*ncpu)
		for id, v := range values {
			keys = append(keys, id)
			for range ncpu {
				vals = append(vals, struct{ Packets, Bytes, NewFlows uint64 }{v, 900 * v, v / 20})
			}
		}
		_, err = m.BatchUpdate(keys, vals, nil)
		m.Close()
		if err != nil {
			tb.Fatal(err)
		}
	}
}

// metrics builds the node's metrics handler as lbd does, with the given settings.
func (n *scaleNode) metrics(tb testing.TB, m config.Metrics) http.Handler {
	tb.Helper()
	cfg := n.cfg
	cfg.Metrics = m
	if err := cfg.Validate(); err != nil {
		tb.Fatal(err)
	}
	dp := &openingDatapath{}
	dp.set(n.mgr)
	met, err := newMetrics(cfg, dp, n.st, n.mgr.Ready, hclog.NewNullLogger())
	if err != nil {
		tb.Fatal(err)
	}
	return met.Handler()
}

// scrape is one scrape's answer as Prometheus asks for it (gzip) and its size before
// compression.
type scrape struct {
	body      []byte // uncompressed
	gzipBytes int
}

// get scrapes h once; with gzip, as Prometheus does (the body is then only counted).
func get(tb testing.TB, h http.Handler, gzip bool) scrape {
	tb.Helper()
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	if gzip {
		req.Header.Set("Accept-Encoding", "gzip")
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusOK {
		tb.Fatalf("scrape: %d %s", w.Code, w.Body.String()[:min(w.Body.Len(), 500)])
	}
	if gzip {
		return scrape{gzipBytes: w.Body.Len()}
	}
	return scrape{body: w.Body.Bytes()}
}

// series returns the sample lines of a scrape.
func (s scrape) series() []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(s.body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if l := sc.Text(); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

// perService and perBackend are the series each service and each backend adds
// (docs/operations.md, "Metrics").
const perService, perBackend = 9, 4

// defaultMetrics is the metrics section of lbd's default configuration, changed by edit.
func defaultMetrics(edit func(*config.Metrics)) config.Metrics {
	m := config.Default().Metrics
	edit(&m)
	return m
}

// backendSeries returns the number of series of each backend="...",service="..." pair.
func backendSeries(lines []string) map[string]int {
	got := map[string]int{}
	for _, l := range lines {
		if i := strings.Index(l, `backend="`); i >= 0 {
			got[l[i:strings.IndexByte(l, '}')]]++
		}
	}
	return got
}

// serviceSeries returns the number of series of each service with a service label.
func serviceSeries(lines []string) map[string]int {
	got := map[string]int{}
	for _, l := range lines {
		if i := strings.Index(l, `service="`); i >= 0 {
			got[l[i+9:i+9+strings.IndexByte(l[i+9:], '"')]]++
		}
	}
	return got
}

// sample returns the value of the sample line that starts with name (labels included).
func sample(tb testing.TB, lines []string, name string) string {
	tb.Helper()
	for _, l := range lines {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return v
		}
	}
	tb.Fatalf("no sample %s", name)
	return ""
}

// TestScrapeScales scrapes an LB node of 1,000 services × 10 backends, programmed into
// real maps (BenchmarkScrape10k measures 10,000 with the default limit of 2,000), with
// the service limit scaled down to 200 where a case needs the node above it:
//
//   - default (below the limit): 9 series per service, none with a backend label, under
//     2 MiB and 20,000 series;
//   - above the limit: no per-service series, the node-level ones count every service
//     and backend, lbd_metrics_services_omitted the services left out;
//   - above the limit with service_series_services: the selected services' series, at
//     most the limit of them, the first by name;
//   - backend_series: every backend's 4 series, above the limit as well;
//   - backend_series_services: the listed services' backends only.
func TestScrapeScales(t *testing.T) {
	const services, per, limit = 1000, 10, 200
	n := newScaleNode(t, services, per)
	scrapeWith := func(edit func(*config.Metrics)) []string {
		return get(t, n.metrics(t, defaultMetrics(edit)), false).series()
	}
	checkServices := func(what string, lines []string, want func(i int) bool) {
		t.Helper()
		got := serviceSeries(lines)
		k := 0
		for i := range services {
			name := scaleName(i)
			if want(i) {
				k++
				if got[name] != perService {
					t.Errorf("%s: %s has %d series, want %d", what, name, got[name], perService)
				}
			} else if got[name] != 0 {
				t.Errorf("%s: %s has %d series, want none", what, name, got[name])
			}
		}
		if want := fmt.Sprint(services - k); sample(t, lines, "lbd_metrics_services_omitted") != want {
			t.Errorf("%s: lbd_metrics_services_omitted %s, want %s", what, sample(t, lines, "lbd_metrics_services_omitted"), want)
		}
	}

	def := get(t, n.metrics(t, config.Default().Metrics), false)
	lines := def.series()
	t.Logf("default: %d series (%d services with series), %d bytes", len(lines), len(serviceSeries(lines)), len(def.body))
	if b := backendSeries(lines); len(b) > 0 {
		t.Errorf("default scrape has %d series with a backend label", len(b))
	}
	checkServices("default", lines, func(int) bool { return true })
	if len(lines) >= 20000 || len(def.body) >= 2<<20 {
		t.Errorf("default scrape: %d series and %d bytes, want < 20,000 and < 2 MiB", len(lines), len(def.body))
	}

	above := scrapeWith(func(m *config.Metrics) { m.ServiceSeriesLimit = limit })
	t.Logf("above the limit: %d series", len(above))
	checkServices("above the limit", above, func(int) bool { return false })
	if b := backendSeries(above); len(b) > 0 {
		t.Errorf("above the limit: %d series with a backend label", len(b))
	}
	// No health checks: every backend's health is unknown, and every one usable.
	for name, want := range map[string]string{
		`lbd_services{state="ready"}`:                   fmt.Sprint(services),
		`lbd_services{state="pending"}`:                 "0",
		`lbd_services_backends{health="unknown"}`:       fmt.Sprint(services * per),
		`lbd_services_backends{health="down"}`:          "0",
		`lbd_services_usable_backends`:                  fmt.Sprint(services * per),
		`lbd_services_advertisement{state="withdrawn"}`: fmt.Sprint(services),
	} {
		if got := sample(t, above, name); got != want {
			t.Errorf("above the limit: %s %s, want %s", name, got, want)
		}
	}
	if len(above) > 200 {
		t.Errorf("above the limit: %d series, want the node-level ones only (< 200)", len(above))
	}

	selected := scrapeWith(func(m *config.Metrics) {
		m.ServiceSeriesLimit, m.ServiceSeriesServices = limit, []string{"svc-00007", "svc-001*"}
	})
	checkServices("service_series_services", selected, func(i int) bool { return i == 7 || i >= 100 && i < 200 })
	capped := scrapeWith(func(m *config.Metrics) { m.ServiceSeriesLimit, m.ServiceSeriesServices = limit, []string{"svc-0*"} })
	checkServices("service_series_services beyond the limit", capped, func(i int) bool { return i < limit })
	checkServices("no limit", scrapeWith(func(m *config.Metrics) { m.ServiceSeriesLimit = 0 }), func(int) bool { return true })

	for _, l := range []int{0, limit} {
		all := scrapeWith(func(m *config.Metrics) { m.BackendSeries, m.ServiceSeriesLimit = true, l })
		got := backendSeries(all)
		for _, s := range n.svcs {
			for _, b := range s.Backends {
				key := fmt.Sprintf(`backend="%s:%d",service="%s"`, b.Address, b.Port, s.Name)
				if got[key] != perBackend {
					t.Fatalf("backend_series, limit %d: %s has %d series, want %d", l, key, got[key], perBackend)
				}
			}
		}
		if len(got) != services*per {
			t.Errorf("backend_series, limit %d: %d backends with series, want %d", l, len(got), services*per)
		}
	}

	listed := scrapeWith(func(m *config.Metrics) { m.BackendSeriesServices = []string{"svc-00007", "svc-001*"} })
	want := map[string]bool{"svc-00007": true}
	for i := 100; i < 200; i++ {
		want[scaleName(i)] = true
	}
	seen := map[string]int{}
	for key := range backendSeries(listed) {
		seen[key[strings.Index(key, `service="`)+9:len(key)-1]]++
	}
	if len(seen) != len(want) {
		t.Errorf("backend_series_services: backends of %d services, want %d", len(seen), len(want))
	}
	for svc, k := range seen {
		if !want[svc] || k != per {
			t.Errorf("backend_series_services: %d backends of %s", k, svc)
		}
	}
}

// BenchmarkScrape10k measures one scrape of an LB node with 10,000 services × 10
// backends in real maps, as Prometheus asks for it (gzip), four ways in the same run:
//
//   - before: the scrape lbd did until per-backend series became optional, rebuilt
//     here: every service's and backend's counters read with one lookup each, and
//     every backend exported (as backend_series: true does now);
//   - default: lbd's default configuration: above its service_series_limit (2,000), the
//     node-level series only;
//   - limit_0: service_series_limit 0, every service's 9 series (the default until the
//     limit came);
//   - backend_series: per-backend series for every service, and every service's own
//     (service_series_limit 0).
//
// Reported per scrape: cpu-ms (the process's user and system time, garbage collection
// included), MiB (uncompressed) and gzip-MiB, series; x-before is before's CPU over
// this case's. The default's size is checked against the bounds docs/operations.md
// gives (< 20,000 series, < 2 MiB).
func BenchmarkScrape10k(b *testing.B) {
	n := newScaleNode(b, 10000, 10)
	var beforeCPU float64
	for _, c := range []struct {
		name    string
		handler http.Handler
	}{
		{"before", n.beforeHandler(b)},
		{"default", n.metrics(b, config.Default().Metrics)},
		{"limit_0", n.metrics(b, defaultMetrics(func(m *config.Metrics) { m.ServiceSeriesLimit = 0 }))},
		{"backend_series", n.metrics(b, defaultMetrics(func(m *config.Metrics) { m.ServiceSeriesLimit, m.BackendSeries = 0, true }))},
	} {
		b.Run(c.name, func(b *testing.B) {
			plain := get(b, c.handler, false)
			series := len(plain.series())
			if c.name == "default" && (series >= 20000 || len(plain.body) >= 2<<20) {
				b.Fatalf("default scrape: %d series and %d bytes, want < 20,000 and < 2 MiB", series, len(plain.body))
			}
			var gz int
			cpu0 := cpuTime(b)
			for b.Loop() {
				gz = get(b, c.handler, true).gzipBytes
			}
			cpu := float64(cpuTime(b)-cpu0) / float64(b.N) / 1e6
			if c.name == "before" {
				beforeCPU = cpu
			}
			b.ReportMetric(cpu, "cpu-ms/scrape")
			b.ReportMetric(float64(len(plain.body))/(1<<20), "MiB/scrape")
			b.ReportMetric(float64(gz)/(1<<20), "gzip-MiB/scrape")
			b.ReportMetric(float64(series), "series")
			if beforeCPU > 0 {
				b.ReportMetric(beforeCPU/cpu, "x-before")
			}
		})
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// beforeHandler is the scrape of lbd before per-backend series became optional,
// rebuilt: the datapath's counters read with one lookup per service, per backend and per
// drop reason (the GetStats of then), every service listed whole from the store, and a
// constant metric per series gathered by the client library's registry.
func (n *scaleNode) beforeHandler(tb testing.TB) http.Handler {
	tb.Helper()
	open := func(name string) *ebpf.Map {
		m, err := ebpf.LoadPinnedMap(filepath.Join(n.cfg.Datapath.BPFFSDir, "lb", name), nil)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { m.Close() })
		return m
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&beforeCollector{svcMap: open(lbxdp.MapServiceStats), beMap: open(lbxdp.MapBackendStats), dropMap: open(lbxdp.MapDropStats), st: n.st, programmed: n.svcs})
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

type beforeCollector struct {
	svcMap, beMap, dropMap *ebpf.Map
	st                     *store.Store
	programmed             []*lbdv1.Service
}

var (
	bSvcPackets = prometheus.NewDesc("lbd_service_packets_total", "h", []string{"service"}, nil)
	bSvcBytes   = prometheus.NewDesc("lbd_service_bytes_total", "h", []string{"service"}, nil)
	bSvcFlows   = prometheus.NewDesc("lbd_service_new_flows_total", "h", []string{"service"}, nil)
	bBePackets  = prometheus.NewDesc("lbd_backend_packets_total", "h", []string{"service", "backend"}, nil)
	bBeBytes    = prometheus.NewDesc("lbd_backend_bytes_total", "h", []string{"service", "backend"}, nil)
	bBeFlows    = prometheus.NewDesc("lbd_backend_new_flows_total", "h", []string{"service", "backend"}, nil)
	bEvents     = prometheus.NewDesc("lbd_datapath_packets_total", "h", []string{"reason"}, nil)
	bUsable     = prometheus.NewDesc("lbd_service_usable_backends", "h", []string{"service"}, nil)
	bAdvertised = prometheus.NewDesc("lbd_service_advertised", "h", []string{"service"}, nil)
	bReady      = prometheus.NewDesc("lbd_service_ready", "h", []string{"service"}, nil)
	bHealth     = prometheus.NewDesc("lbd_backend_health", "h", []string{"service", "backend"}, nil)
)

func (c *beforeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{bSvcPackets, bSvcBytes, bSvcFlows, bBePackets, bBeBytes, bBeFlows, bEvents, bUsable, bAdvertised, bReady, bHealth} {
		ch <- d
	}
}

type beforeCounter struct{ Packets, Bytes, NewFlows uint64 }

func lookupCounter(m *ebpf.Map, id uint32) (c beforeCounter, err error) {
	var per []beforeCounter
	if err := m.Lookup(id, &per); err != nil {
		return c, err
	}
	for _, p := range per {
		c.Packets, c.Bytes, c.NewFlows = c.Packets+p.Packets, c.Bytes+p.Bytes, c.NewFlows+p.NewFlows
	}
	return c, nil
}

func (c *beforeCollector) Collect(ch chan<- prometheus.Metric) {
	resp := &lbdv1.GetStatsResponse{}
	for _, s := range c.programmed {
		sc, err := lookupCounter(c.svcMap, s.Id)
		if err != nil {
			ch <- prometheus.NewInvalidMetric(bEvents, err)
			return
		}
		ss := &lbdv1.ServiceStats{ServiceName: s.Name, Packets: sc.Packets, Bytes: sc.Bytes, NewFlows: sc.NewFlows}
		for _, b := range s.Backends {
			bc, err := lookupCounter(c.beMap, b.Id)
			if err != nil {
				ch <- prometheus.NewInvalidMetric(bEvents, err)
				return
			}
			ss.Backends = append(ss.Backends, &lbdv1.BackendStats{Address: netip.MustParseAddr(b.Address).String(), Port: b.Port,
				Packets: bc.Packets, Bytes: bc.Bytes, NewFlows: bc.NewFlows})
		}
		slices.SortFunc(ss.Backends, func(a, b *lbdv1.BackendStats) int {
			return netip.MustParseAddr(a.Address).Compare(netip.MustParseAddr(b.Address))
		})
		resp.Services = append(resp.Services, ss)
	}
	slices.SortFunc(resp.Services, func(a, b *lbdv1.ServiceStats) int { return strings.Compare(a.ServiceName, b.ServiceName) })
	for r := range uint32(13) {
		dc, err := lookupCounter(c.dropMap, r)
		if err != nil {
			ch <- prometheus.NewInvalidMetric(bEvents, err)
			return
		}
		resp.Reasons = append(resp.Reasons, &lbdv1.Counter{Name: fmt.Sprintf("lb_drop_%d", r), Packets: dc.Packets, Bytes: dc.Bytes})
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for _, s := range resp.Services {
		counter(bSvcPackets, s.Packets, s.ServiceName)
		counter(bSvcBytes, s.Bytes, s.ServiceName)
		counter(bSvcFlows, s.NewFlows, s.ServiceName)
		for _, b := range s.Backends {
			be := net.JoinHostPort(b.Address, strconv.Itoa(int(b.Port)))
			counter(bBePackets, b.Packets, s.ServiceName, be)
			counter(bBeBytes, b.Bytes, s.ServiceName, be)
			counter(bBeFlows, b.NewFlows, s.ServiceName, be)
		}
	}
	for _, r := range resp.Reasons {
		counter(bEvents, r.Packets, r.Name)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, s := range c.st.ListServices("") {
		st := s.GetStatus()
		gauge(bUsable, float64(st.GetUsableBackends()), s.Name)
		gauge(bAdvertised, map[bool]float64{true: 1}[st.GetAdvertised()], s.Name)
		gauge(bReady, map[bool]float64{true: 1}[st.GetState() == lbdv1.ServiceState_SERVICE_STATE_READY], s.Name)
		for _, b := range s.Backends {
			v := -1.0
			switch b.GetHealth().GetState() {
			case lbdv1.HealthState_HEALTH_STATE_UP:
				v = 1
			case lbdv1.HealthState_HEALTH_STATE_DOWN:
				v = 0
			}
			gauge(bHealth, v, s.Name, net.JoinHostPort(b.Address, strconv.Itoa(int(b.Port))))
		}
	}
}
