// Package metrics exports lbd's Prometheus metrics: datapath counters read from the BPF
// maps at scrape time, conntrack/NAT fill, garbage-collector passes and reconcile latency.
package metrics

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/gc"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// StatsFunc reads the datapath counters (the GetStats RPC's answer).
type StatsFunc func() (*lbdv1.GetStatsResponse, error)

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
}

// New builds the registry. stats may be nil on a node without a datapath; capacities
// are the sizes of the conntrack ("conntrack") and NAT ("nat") tables.
func New(stats StatsFunc, capacities map[string]uint32) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
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
	}
	m.reg.MustRegister(m.gcPasses, m.gcDeleted, m.gcDuration, m.gcInterval, m.entries, m.capacity, m.fill, m.reconcile,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for t, c := range capacities {
		m.capacity.WithLabelValues(t).Set(float64(c))
	}
	if stats != nil {
		m.reg.MustRegister(&datapathCollector{stats: stats})
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

// Handler serves the registry.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
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

// datapathCollector reads the BPF counters at scrape time.
type datapathCollector struct{ stats StatsFunc }

var (
	svcPackets = prometheus.NewDesc("lbd_service_packets_total", "Packets forwarded for a service.", []string{"service"}, nil)
	svcBytes   = prometheus.NewDesc("lbd_service_bytes_total", "Bytes (client IP packets) forwarded for a service.", []string{"service"}, nil)
	svcFlows   = prometheus.NewDesc("lbd_service_new_flows_total", "New flows balanced for a service.", []string{"service"}, nil)
	bePackets  = prometheus.NewDesc("lbd_backend_packets_total", "Packets forwarded to a backend.", []string{"service", "backend"}, nil)
	beBytes    = prometheus.NewDesc("lbd_backend_bytes_total", "Bytes forwarded to a backend.", []string{"service", "backend"}, nil)
	beFlows    = prometheus.NewDesc("lbd_backend_new_flows_total", "New flows balanced to a backend.", []string{"service", "backend"}, nil)
	events     = prometheus.NewDesc("lbd_datapath_packets_total", "Datapath packets by event or drop reason.", []string{"reason"}, nil)
	sockEvents = prometheus.NewDesc("lbd_socket_lb_calls_total", "Socket calls of local processes handled by socket-level load balancing, by event (connect, sendmsg, reverse, no_backend, revnat_full).", []string{"event"}, nil)
	ctEvents   = prometheus.NewDesc("lbd_conntrack_events_total", "What the LB node's conntrack did, by event: inserted, tentative, confirmed, guard_skipped, guard_engaged, insert_failed, reclaimed.", []string{"event"}, nil)
)

func (c *datapathCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{svcPackets, svcBytes, svcFlows, bePackets, beBytes, beFlows, events, sockEvents, ctEvents} {
		ch <- d
	}
}

func (c *datapathCollector) Collect(ch chan<- prometheus.Metric) {
	st, err := c.stats()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(events, err)
		return
	}
	for _, s := range st.Services {
		ch <- prometheus.MustNewConstMetric(svcPackets, prometheus.CounterValue, float64(s.Packets), s.ServiceName)
		ch <- prometheus.MustNewConstMetric(svcBytes, prometheus.CounterValue, float64(s.Bytes), s.ServiceName)
		ch <- prometheus.MustNewConstMetric(svcFlows, prometheus.CounterValue, float64(s.NewFlows), s.ServiceName)
		for _, b := range s.Backends {
			be := net.JoinHostPort(b.Address, strconv.Itoa(int(b.Port)))
			ch <- prometheus.MustNewConstMetric(bePackets, prometheus.CounterValue, float64(b.Packets), s.ServiceName, be)
			ch <- prometheus.MustNewConstMetric(beBytes, prometheus.CounterValue, float64(b.Bytes), s.ServiceName, be)
			ch <- prometheus.MustNewConstMetric(beFlows, prometheus.CounterValue, float64(b.NewFlows), s.ServiceName, be)
		}
	}
	for _, r := range st.Reasons {
		ch <- prometheus.MustNewConstMetric(events, prometheus.CounterValue, float64(r.Packets), r.Name)
	}
	for _, e := range st.SocketEvents {
		ch <- prometheus.MustNewConstMetric(sockEvents, prometheus.CounterValue, float64(e.Count), e.Name)
	}
	for _, e := range st.ConntrackEvents {
		ch <- prometheus.MustNewConstMetric(ctEvents, prometheus.CounterValue, float64(e.Count), e.Name)
	}
}
