package metrics

import (
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// ReadyFunc says whether the node forwards what it is asked to, and why not.
type ReadyFunc func() (bool, string)

var (
	nodeReady = prometheus.NewDesc("lbd_ready", "1 while the node is ready: its datapath attached and in line with the desired state (what /readyz and gRPC health say).", nil, nil)
	drift     = prometheus.NewDesc("lbd_datapath_drift_repaired_total", "Differences between the datapath and the desired state found and repaired, by kind.", []string{"kind"}, nil)
	drained   = prometheus.NewDesc("lbd_node_drained", "1 while the node is drained (lbctl node drain): its VIPs are withdrawn on purpose.", nil, nil)
)

// AddBuildInfo exports lbd_build_info: 1, labelled with lbd's version, the Go version
// it was built with and the node's roles ("lb", "backend", both comma-separated in
// that order, or "none"), so that queries can join on it by instance.
func (m *Metrics) AddBuildInfo(version string, roles []string) {
	var rs []string
	for _, r := range []string{"lb", "backend"} {
		if slices.Contains(roles, r) {
			rs = append(rs, r)
		}
	}
	role := strings.Join(rs, ",")
	if role == "" {
		role = "none"
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "lbd_build_info",
		Help:        "1, labelled with lbd's version, the Go version that built it and the node's roles.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version(), "roles": role},
	})
	g.Set(1)
	m.reg.MustRegister(g)
}

// AddDrained exports lbd_node_drained.
func (m *Metrics) AddDrained(isDrained func() bool) {
	m.reg.MustRegister(prometheus.CollectorFunc(func(ch chan<- prometheus.Metric) {
		ch <- prometheus.MustNewConstMetric(drained, prometheus.GaugeValue, boolValue(isDrained()))
	}))
}

// SetReady exports readiness as lbd_ready and serves it on /readyz (200 when ready,
// 503 with the reason when not).
func (m *Metrics) SetReady(ready ReadyFunc) {
	m.ready = ready
	m.reg.MustRegister(&readyCollector{ready})
}

// AddDrift exports the datapath's repair counts.
func (m *Metrics) AddDrift(counts func() map[string]uint64) {
	m.reg.MustRegister(&driftCollector{counts})
}

type readyCollector struct{ ready ReadyFunc }

func (c *readyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- nodeReady }

func (c *readyCollector) Collect(ch chan<- prometheus.Metric) {
	ok, _ := c.ready()
	ch <- prometheus.MustNewConstMetric(nodeReady, prometheus.GaugeValue, boolValue(ok))
}

type driftCollector struct{ counts func() map[string]uint64 }

func (c *driftCollector) Describe(ch chan<- *prometheus.Desc) { ch <- drift }

func (c *driftCollector) Collect(ch chan<- prometheus.Metric) {
	for kind, n := range c.counts() {
		ch <- prometheus.MustNewConstMetric(drift, prometheus.CounterValue, float64(n), kind)
	}
}

// readyz answers 200 while the node is ready and 503 otherwise, with the reason.
func (m *Metrics) readyz(w http.ResponseWriter, _ *http.Request) {
	ok, why := true, "ready"
	if m.ready != nil {
		ok, why = m.ready()
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "not ready: %s\n", why)
		return
	}
	fmt.Fprintf(w, "ready: %s\n", why)
}

// healthz is liveness: the process serves HTTP.
func healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintln(w, "ok")
}
