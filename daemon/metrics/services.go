package metrics

import (
	"slices"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/servicematch"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// ServiceSeries bounds the services that get per-service series (lbd_service_*): every
// service while there are at most Limit of them (or Limit is 0); above it, only those
// Services selects, the first Limit of them by name. The choice depends on the names
// alone, so the same services keep their series from one scrape to the next.
type ServiceSeries struct {
	Limit    int
	Services servicematch.Set
}

// omittedFamily counts the services left without per-service series.
const omittedFamily = "lbd_metrics_services_omitted"

// pick returns the services of names (each once, in any order) that get per-service
// series, nil for every one, and how many are left out.
func (s ServiceSeries) pick(names []string) (keep map[string]bool, omitted int) {
	if s.Limit == 0 || len(names) <= s.Limit {
		return nil, 0
	}
	var chosen []string
	for _, n := range names {
		if s.Services.Match(n) {
			chosen = append(chosen, n)
		}
	}
	if len(chosen) > s.Limit {
		slices.Sort(chosen)
		chosen = chosen[:s.Limit]
	}
	keep = make(map[string]bool, len(chosen))
	for _, n := range chosen {
		keep[n] = true
	}
	return keep, len(names) - len(chosen)
}

// exported reports whether keep (from pick) gives the named service its series.
func exported(keep map[string]bool, name string) bool { return keep == nil || keep[name] }

// writeServices writes the families that grow with services and backends: it reads the
// services' status and the datapath's counters once, picks the services that get
// series of their own, and writes those, the node-level sums of every service, and
// how many services were left out. A source that cannot be read leaves its families
// out and is counted.
func (m *Metrics) writeServices(t *textWriter) {
	var backendsOf func(string) bool
	if !m.backends.none() {
		backendsOf = m.backends.For
	}
	var svcs []store.StatusCounts
	if m.status != nil {
		svcs = m.status(backendsOf)
	}
	var st *lbdv1.GetStatsResponse
	if m.stats != nil {
		var err error
		if st, err = m.stats(backendsOf); err != nil {
			m.readErrors.WithLabelValues("datapath").Inc()
			st = nil
		}
	}
	// The services are the store's; a node that has none (tests) counts the datapath's.
	var names []string
	if m.status != nil {
		names = make([]string, len(svcs))
		for i, s := range svcs {
			names[i] = s.Name
		}
	} else if st != nil {
		names = make([]string, len(st.Services))
		for i, s := range st.Services {
			names[i] = s.ServiceName
		}
	}
	keep, omitted := m.services.pick(names)
	if st != nil {
		var total *counts
		if m.lb {
			c := m.totals.add(st.Services)
			total = &c
		}
		writeDatapath(t, st, keep, total, backendsOf != nil)
	}
	if m.status != nil {
		writeStatus(t, svcs, keep)
	}
	t.family(omittedFamily, "gauge", "Services left without per-service series: above metrics.service_series_limit, those that metrics.service_series_services does not select (or beyond the limit).")
	t.gauge(omittedFamily, int64(omitted))
	m.omitted.note(omitted, len(names), m.services.Limit)
}

// omittedLog logs each change of the number of services left without series.
type omittedLog struct {
	log  hclog.Logger
	mu   sync.Mutex
	last int // -1 before the first scrape
}

func (o *omittedLog) note(omitted, services, limit int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if omitted == o.last || (o.last == -1 && omitted == 0) {
		o.last = omitted
		return
	}
	o.last = omitted
	if omitted == 0 {
		o.log.Info("every service has its per-service series again", "op", "metrics", "services", services, "limit", limit)
		return
	}
	o.log.Warn("services left without per-service series (node-level series count them all; lbctl stats shows each)",
		"op", "metrics", "omitted", omitted, "services", services, "limit", limit,
		"fix", "raise metrics.service_series_limit or select services with metrics.service_series_services")
}
