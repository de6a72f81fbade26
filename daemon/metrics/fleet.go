package metrics

import "github.com/prometheus/client_golang/prometheus"

// FleetFunc reads the fleet view: how many services the registered nodes disagree on,
// and whether the view is current (etcd reachable).
type FleetFunc func() (diverged int, current bool)

var (
	fleetDiverged = prometheus.NewDesc("lbd_fleet_diverged_services", "Services whose digests (Maglev table and backend set as the datapath holds them, or spec) differ between the fleet's registered LB nodes, or that some of them lack.", nil, nil)
	fleetStale    = prometheus.NewDesc("lbd_fleet_stale", "1 while this node cannot reach the fleet's etcd store: its services and its fleet view are as of the last contact.", nil, nil)
)

// AddFleet exports the fleet view of a node on the etcd store.
func (m *Metrics) AddFleet(read FleetFunc) { m.reg.MustRegister(&fleetCollector{read}) }

type fleetCollector struct{ read FleetFunc }

func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- fleetDiverged
	ch <- fleetStale
}

func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	n, current := c.read()
	ch <- prometheus.MustNewConstMetric(fleetDiverged, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(fleetStale, prometheus.GaugeValue, boolValue(!current))
}
