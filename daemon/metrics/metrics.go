// Package metrics exports lbd's Prometheus metrics: datapath counters read from the BPF
// maps at scrape time, the services' status, conntrack/NAT fill, garbage-collector
// passes and reconcile latency. The node-level series count every service together;
// per-service series are bounded by ServiceSeries, and nothing has a backend label
// unless BackendSeries asks for it: by default a node exports a bounded number of
// series, however many services and backends it holds.
package metrics

import (
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/gc"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"
)

// Metrics holds lbd's registry.
type Metrics struct {
	reg        *prometheus.Registry
	gcPasses   *prometheus.CounterVec
	gcDeleted  *prometheus.CounterVec
	gcDuration *prometheus.HistogramVec
	gcInterval *prometheus.GaugeVec
	entries    *prometheus.GaugeVec
	capacity   *prometheus.GaugeVec
	fill       *prometheus.GaugeVec
	reconcile  prometheus.Histogram
	ready      ReadyFunc
	readErrors *prometheus.CounterVec
	// The families that grow with services and backends, written through textWriter.
	stats    StatsFunc // nil on a node without a datapath
	lb       bool
	status   StatusFunc // nil until AddStatus
	backends BackendSeries
	services ServiceSeries
	totals   lbTotals
	omitted  omittedLog
}

// Options chooses what New's metrics hold besides the node-level series.
type Options struct {
	// LB says that the node has the LB role: stats has its services' counters, and
	// their node totals are exported (0 with no service).
	LB bool
	// Capacities are the sizes of the conntrack ("conntrack") and NAT ("nat") tables.
	Capacities map[string]uint32
	// Backends says which services' backends get series of their own.
	Backends BackendSeries
	// Services bounds the services that get per-service series.
	Services ServiceSeries
	// Log gets a warning each time the number of services left without per-service
	// series changes; nil: no log.
	Log hclog.Logger
}

// Register adds other packages' collectors (the API's counters) to the registry.
func (m *Metrics) Register(cs ...prometheus.Collector) { m.reg.MustRegister(cs...) }

// New builds the registry. stats may be nil on a node without a datapath.
func New(stats StatsFunc, opts Options) *Metrics {
	log := opts.Log
	if log == nil {
		log = hclog.NewNullLogger()
	}
	m := &Metrics{
		reg:      prometheus.NewRegistry(),
		stats:    stats,
		lb:       opts.LB && stats != nil,
		backends: opts.Backends,
		services: opts.Services,
		omitted:  omittedLog{log: log, last: -1},
		gcPasses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lbd_gc_passes_total", Help: "Garbage-collector passes over a table.",
		}, []string{"table"}),
		gcDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lbd_gc_deleted_entries_total", Help: "Expired entries the garbage collector deleted.",
		}, []string{"table"}),
		gcDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "lbd_gc_pass_duration_seconds", Help: "Duration of garbage-collector passes.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 8),
		}, []string{"table"}),
		gcInterval: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lbd_gc_interval_seconds", Help: "Current adaptive interval between garbage-collector passes.",
		}, []string{"table"}),
		entries: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lbd_table_entries", Help: "Live entries after the last garbage-collector pass.",
		}, []string{"table"}),
		capacity: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lbd_table_capacity_entries", Help: "Configured size of the table (conntrack_size, nat_size).",
		}, []string{"table"}),
		fill: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lbd_table_fill_ratio", Help: "Live entries divided by what the table's map can hold, after the last garbage-collector pass (conntrack: the fuller of its IPv4 and IPv6 maps, which hold a quarter more than conntrack_size).",
		}, []string{"table"}),
		reconcile: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "lbd_reconcile_duration_seconds", Help: "Time to program one service change into the datapath.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 9),
		}),
		readErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lbd_metrics_read_errors_total", Help: "Scrapes that could not read a source (datapath: its counters; registry: another metric), whose series they then lacked.",
		}, []string{"source"}),
	}
	m.reg.MustRegister(m.gcPasses, m.gcDeleted, m.gcDuration, m.gcInterval, m.entries, m.capacity, m.fill, m.reconcile, m.readErrors,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Both sources start at 0, so that a rule can tell an increase from a missing series.
	m.readErrors.WithLabelValues("datapath")
	m.readErrors.WithLabelValues("registry")
	for t, c := range opts.Capacities {
		m.capacity.WithLabelValues(t).Set(float64(c))
	}
	return m
}

// ObserveGC records one collector pass.
func (m *Metrics) ObserveGC(p gc.Pass) {
	if p.Err != nil {
		return
	}
	m.gcPasses.WithLabelValues(p.Table).Inc()
	m.gcDeleted.WithLabelValues(p.Table).Add(float64(p.Deleted))
	m.gcDuration.WithLabelValues(p.Table).Observe(p.Duration.Seconds())
	m.gcInterval.WithLabelValues(p.Table).Set(p.Next.Seconds())
	m.entries.WithLabelValues(p.Table).Set(float64(p.Scanned - p.Deleted))
	m.fill.WithLabelValues(p.Table).Set(p.Fill)
}

// ObserveReconcile records how long one service change took to reach the datapath.
func (m *Metrics) ObserveReconcile(d time.Duration) { m.reconcile.Observe(d.Seconds()) }

// Handler serves the metrics in the Prometheus text format, gzip-compressed when the
// client accepts it (Prometheus does): the registry's families, then those written
// straight from the datapath's counters and the services' status.
func (m *Metrics) Handler() http.Handler { return http.HandlerFunc(m.serveMetrics) }

func (m *Metrics) serveMetrics(w http.ResponseWriter, r *http.Request) {
	mfs, err := m.reg.Gather()
	if err != nil {
		// What could be gathered is served, as promhttp's ContinueOnError does.
		m.readErrors.WithLabelValues("registry").Inc()
	}
	w.Header().Set("Content-Type", string(expfmt.FmtText))
	var out io.Writer = w
	if acceptsGzip(r.Header.Get("Accept-Encoding")) {
		w.Header().Set("Content-Encoding", "gzip")
		// The fastest level: the text is repetitive enough for a tenfold reduction.
		gz, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
		defer gz.Close()
		out = gz
	}
	bw := bufio.NewWriterSize(out, 64<<10)
	defer bw.Flush()
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(bw, mf); err != nil {
			return // the client went away
		}
	}
	m.writeServices(&textWriter{w: bw})
}

// acceptsGzip reports whether an Accept-Encoding header accepts gzip.
func acceptsGzip(header string) bool {
	for _, part := range strings.Split(header, ",") {
		coding, params, _ := strings.Cut(part, ";")
		if strings.TrimSpace(coding) == "gzip" {
			q := strings.ReplaceAll(params, " ", "")
			return q != "q=0" && q != "q=0.0" && q != "q=0.00" && q != "q=0.000"
		}
	}
	return false
}

// Serve serves /metrics, /readyz (readiness, see SetReady) and /healthz (liveness) on
// addr until ctx ends.
func (m *Metrics) Serve(ctx context.Context, addr string, log hclog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	mux.HandleFunc("/readyz", m.readyz)
	mux.HandleFunc("/healthz", healthz)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("metrics listening", "op", "start", "addr", ln.Addr().String())
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
