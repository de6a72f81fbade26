package metrics

import (
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// StatusFunc lists the services' status in numbers, with each backend's health for the
// services backendsOf selects (the store's StatusCounts).
type StatusFunc func(backendsOf func(service string) bool) []store.StatusCounts

// Status families.
const (
	svcUsable     = "lbd_service_usable_backends"
	svcAdvertised = "lbd_service_advertised"
	svcReady      = "lbd_service_ready"
	svcBackends   = "lbd_service_backends"
	beHealth      = "lbd_backend_health"
)

// AddStatus exports the services' status: usable backends, ready, advertised, their
// backends counted by health, and each backend's health where New's BackendSeries asks
// for it.
func (m *Metrics) AddStatus(list StatusFunc) {
	m.streams = append(m.streams, func(t *textWriter) error {
		var of func(string) bool
		if !m.backends.none() {
			of = m.backends.For
		}
		writeStatus(t, list(of))
		return nil
	})
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func writeStatus(t *textWriter, svcs []store.StatusCounts) {
	t.family(svcUsable, "gauge", "Backends of a service that take new flows.")
	for _, s := range svcs {
		t.gauge(svcUsable, int64(s.Usable), "service", s.Name)
	}
	t.family(svcAdvertised, "gauge", "1 if the service's VIP is advertised over BGP.")
	for _, s := range svcs {
		t.gauge(svcAdvertised, boolInt(s.Advertised), "service", s.Name)
	}
	t.family(svcReady, "gauge", "1 if the service is programmed with at least one usable backend.")
	for _, s := range svcs {
		t.gauge(svcReady, boolInt(s.State == lbdv1.ServiceState_SERVICE_STATE_READY), "service", s.Name)
	}
	t.family(svcBackends, "gauge", "Backends of a service by health: up, down, unknown (not checked, or no verdict yet).")
	for _, s := range svcs {
		t.gauge(svcBackends, int64(s.Down), "health", "down", "service", s.Name)
		t.gauge(svcBackends, int64(s.Unknown), "health", "unknown", "service", s.Name)
		t.gauge(svcBackends, int64(s.Up), "health", "up", "service", s.Name)
	}
	started := false
	for _, s := range svcs {
		for _, b := range s.Backends {
			if !started {
				t.family(beHealth, "gauge", "Health of a backend: 1 up, 0 down, -1 not checked or not yet known"+onlyWith+".")
				started = true
			}
			v := int64(-1)
			switch b.Health {
			case lbdv1.HealthState_HEALTH_STATE_UP:
				v = 1
			case lbdv1.HealthState_HEALTH_STATE_DOWN:
				v = 0
			}
			t.gauge(beHealth, v, "backend", backendLabel(b.Address, b.Port), "service", s.Name)
		}
	}
}
