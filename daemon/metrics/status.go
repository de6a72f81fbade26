package metrics

import (
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"github.com/prometheus/client_golang/prometheus"
)

// ServicesFunc lists the services with their status (the store's ListServices).
type ServicesFunc func() []*lbdv1.Service

var (
	svcUsable     = prometheus.NewDesc("lbd_service_usable_backends", "Backends of a service that take new flows.", []string{"service"}, nil)
	svcAdvertised = prometheus.NewDesc("lbd_service_advertised", "1 if the service's VIP is advertised over BGP.", []string{"service"}, nil)
	svcReady      = prometheus.NewDesc("lbd_service_ready", "1 if the service is programmed with at least one usable backend.", []string{"service"}, nil)
	svcBackends   = prometheus.NewDesc("lbd_service_backends", "Backends of a service by health: up, down, unknown (not checked, or no verdict yet).", []string{"service", "health"}, nil)
	beHealth      = prometheus.NewDesc("lbd_backend_health", "Health of a backend: 1 up, 0 down, -1 not checked or not yet known (only with metrics.backend_series or metrics.backend_series_services).", []string{"service", "backend"}, nil)
)

// statusCollector exports the services' output-only status at scrape time.
type statusCollector struct {
	list     ServicesFunc
	backends BackendSeries
}

// AddStatus exports the services' status: usable backends, ready, advertised, their
// backends' health counted by state, and each backend's health where New's
// BackendSeries asks for it.
func (m *Metrics) AddStatus(list ServicesFunc) {
	m.reg.MustRegister(&statusCollector{list: list, backends: m.backends})
}

func (c *statusCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{svcUsable, svcAdvertised, svcReady, svcBackends, beHealth} {
		ch <- d
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (c *statusCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.list() {
		st := s.GetStatus()
		ch <- prometheus.MustNewConstMetric(svcUsable, prometheus.GaugeValue, float64(st.GetUsableBackends()), s.Name)
		ch <- prometheus.MustNewConstMetric(svcAdvertised, prometheus.GaugeValue, boolValue(st.GetAdvertised()), s.Name)
		ch <- prometheus.MustNewConstMetric(svcReady, prometheus.GaugeValue, boolValue(st.GetState() == lbdv1.ServiceState_SERVICE_STATE_READY), s.Name)
		per := c.backends.For(s.Name)
		var up, down, unknown int
		for _, b := range s.Backends {
			v := -1.0
			switch b.GetHealth().GetState() {
			case lbdv1.HealthState_HEALTH_STATE_UP:
				v = 1
				up++
			case lbdv1.HealthState_HEALTH_STATE_DOWN:
				v = 0
				down++
			default:
				unknown++
			}
			if per {
				ch <- prometheus.MustNewConstMetric(beHealth, prometheus.GaugeValue, v, s.Name, backendLabel(b.Address, b.Port))
			}
		}
		ch <- prometheus.MustNewConstMetric(svcBackends, prometheus.GaugeValue, float64(up), s.Name, "up")
		ch <- prometheus.MustNewConstMetric(svcBackends, prometheus.GaugeValue, float64(down), s.Name, "down")
		ch <- prometheus.MustNewConstMetric(svcBackends, prometheus.GaugeValue, float64(unknown), s.Name, "unknown")
	}
}
