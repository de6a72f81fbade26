package metrics

import (
	"net"
	"strconv"

	"github.com/lbd-dev/lbd/daemon/servicematch"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"github.com/prometheus/client_golang/prometheus"
)

// StatsFunc reads the datapath's counters: every service's, and the backends' of the
// services backendsOf selects (none if it is nil).
type StatsFunc func(backendsOf func(service string) bool) (*lbdv1.GetStatsResponse, error)

// BackendSeries says which services' backends get series of their own (lbd_backend_*):
// none (the zero value), every service's (All), or those of the services that Services
// selects.
type BackendSeries struct {
	All      bool
	Services servicematch.Set
}

// For reports whether the backends of the named service get series.
func (b BackendSeries) For(service string) bool { return b.All || b.Services.Match(service) }

func (b BackendSeries) none() bool { return !b.All && b.Services.Empty() }

// datapathCollector reads the BPF counters at scrape time.
type datapathCollector struct {
	stats    StatsFunc
	backends BackendSeries
}

var (
	svcPackets = prometheus.NewDesc("lbd_service_packets_total", "Packets forwarded for a service.", []string{"service"}, nil)
	svcBytes   = prometheus.NewDesc("lbd_service_bytes_total", "Bytes (client IP packets) forwarded for a service.", []string{"service"}, nil)
	svcFlows   = prometheus.NewDesc("lbd_service_new_flows_total", "New flows balanced for a service.", []string{"service"}, nil)
	bePackets  = prometheus.NewDesc("lbd_backend_packets_total", "Packets forwarded to a backend (only with metrics.backend_series or metrics.backend_series_services).", []string{"service", "backend"}, nil)
	beBytes    = prometheus.NewDesc("lbd_backend_bytes_total", "Bytes forwarded to a backend (only with metrics.backend_series or metrics.backend_series_services).", []string{"service", "backend"}, nil)
	beFlows    = prometheus.NewDesc("lbd_backend_new_flows_total", "New flows balanced to a backend (only with metrics.backend_series or metrics.backend_series_services).", []string{"service", "backend"}, nil)
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
	var of func(string) bool
	if !c.backends.none() {
		of = c.backends.For
	}
	st, err := c.stats(of)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(events, err)
		return
	}
	for _, s := range st.Services {
		ch <- prometheus.MustNewConstMetric(svcPackets, prometheus.CounterValue, float64(s.Packets), s.ServiceName)
		ch <- prometheus.MustNewConstMetric(svcBytes, prometheus.CounterValue, float64(s.Bytes), s.ServiceName)
		ch <- prometheus.MustNewConstMetric(svcFlows, prometheus.CounterValue, float64(s.NewFlows), s.ServiceName)
		for _, b := range s.Backends {
			be := backendLabel(b.Address, b.Port)
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

// backendLabel is a backend's label value: address:port, [address]:port for IPv6.
func backendLabel(addr string, port uint32) string {
	return net.JoinHostPort(addr, strconv.FormatUint(uint64(port), 10))
}
