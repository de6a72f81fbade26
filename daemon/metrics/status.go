package metrics

import (
	"net"
	"strconv"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"github.com/prometheus/client_golang/prometheus"
)

// ServicesFunc lists the services with their status (the store's ListServices).
type ServicesFunc func() []*lbdv1.Service

var (
	svcUsable     = prometheus.NewDesc("lbd_service_usable_backends", "Backends of a service that take new flows.", []string{"service"}, nil)
	svcAdvertised = prometheus.NewDesc("lbd_service_advertised", "1 if the service's VIP is advertised over BGP.", []string{"service"}, nil)
	svcReady      = prometheus.NewDesc("lbd_service_ready", "1 if the service is programmed with at least one usable backend.", []string{"service"}, nil)
	beHealth      = prometheus.NewDesc("lbd_backend_health", "Health of a backend: 1 up, 0 down, -1 not checked or not yet known.", []string{"service", "backend"}, nil)
)

// statusCollector exports the services' output-only status at scrape time.
type statusCollector struct{ list ServicesFunc }

// AddStatus exports the services' status (usable backends, advertised, backend health).
func (m *Metrics) AddStatus(list ServicesFunc) { m.reg.MustRegister(&statusCollector{list}) }

func (c *statusCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{svcUsable, svcAdvertised, svcReady, beHealth} {
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
		for _, b := range s.Backends {
			v := -1.0
			switch b.GetHealth().GetState() {
			case lbdv1.HealthState_HEALTH_STATE_UP:
				v = 1
			case lbdv1.HealthState_HEALTH_STATE_DOWN:
				v = 0
			}
			be := net.JoinHostPort(b.Address, strconv.Itoa(int(b.Port)))
			ch <- prometheus.MustNewConstMetric(beHealth, prometheus.GaugeValue, v, s.Name, be)
		}
	}
}
