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
	allStates     = "lbd_services"
	allAdvertised = "lbd_services_advertisement"
	allBackends   = "lbd_services_backends"
	allUsable     = "lbd_services_usable_backends"
)

// AddStatus exports the services' status: the services counted by state and by
// advertisement and their backends by health, all together; per service (those
// ServiceSeries gives series), usable backends, ready, advertised and backends by
// health; and each backend's health where BackendSeries asks for it.
func (m *Metrics) AddStatus(list StatusFunc) { m.status = list }

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

// states are the label values of lbd_services, in the order written.
var states = []struct {
	label string
	state lbdv1.ServiceState
}{
	{"pending", lbdv1.ServiceState_SERVICE_STATE_PENDING},
	{"ready", lbdv1.ServiceState_SERVICE_STATE_READY},
	{"no_backends", lbdv1.ServiceState_SERVICE_STATE_NO_BACKENDS},
	{"error", lbdv1.ServiceState_SERVICE_STATE_ERROR},
}

// writeStatus writes the node's sums over every service of svcs, then the per-service
// series of those keep selects (pick), then the backends listed.
func writeStatus(t *textWriter, svcs []store.StatusCounts, keep map[string]bool) {
	byState := map[lbdv1.ServiceState]int64{}
	var advertised, up, down, unknown, usable int64
	for _, s := range svcs {
		byState[s.State]++
		advertised += boolInt(s.Advertised)
		up, down, unknown, usable = up+int64(s.Up), down+int64(s.Down), unknown+int64(s.Unknown), usable+int64(s.Usable)
	}
	t.family(allStates, "gauge", "Services by state: pending (not yet programmed), ready, no_backends (none usable), error (the datapath refused it).")
	for _, st := range states {
		t.gauge(allStates, byState[st.state], "state", st.label)
	}
	t.family(allAdvertised, "gauge", "Services by the advertisement of their VIP over BGP: advertised, withdrawn (not advertised: no usable backend, the node drained, or no BGP).")
	t.gauge(allAdvertised, advertised, "state", "advertised")
	t.gauge(allAdvertised, int64(len(svcs))-advertised, "state", "withdrawn")
	t.family(allBackends, "gauge", "Backends of every service together by health: up, down, unknown (a backend of two services counts twice).")
	t.gauge(allBackends, down, "health", "down")
	t.gauge(allBackends, unknown, "health", "unknown")
	t.gauge(allBackends, up, "health", "up")
	t.family(allUsable, "gauge", "Backends of every service together that take new flows (a backend of two services counts twice).")
	t.gauge(allUsable, usable)

	// Per service: each family's samples in the order of svcs.
	each := func(name, help string, write func(s *store.StatusCounts)) {
		started := false
		for i := range svcs {
			if !exported(keep, svcs[i].Name) {
				continue
			}
			if !started {
				t.family(name, "gauge", help+perService+".")
				started = true
			}
			write(&svcs[i])
		}
	}
	each(svcUsable, "Backends of a service that take new flows", func(s *store.StatusCounts) {
		t.gauge(svcUsable, int64(s.Usable), "service", s.Name)
	})
	each(svcAdvertised, "1 if the service's VIP is advertised over BGP", func(s *store.StatusCounts) {
		t.gauge(svcAdvertised, boolInt(s.Advertised), "service", s.Name)
	})
	each(svcReady, "1 if the service is programmed with at least one usable backend", func(s *store.StatusCounts) {
		t.gauge(svcReady, boolInt(s.State == lbdv1.ServiceState_SERVICE_STATE_READY), "service", s.Name)
	})
	each(svcBackends, "Backends of a service by health: up, down, unknown (not checked, or no verdict yet)", func(s *store.StatusCounts) {
		t.gauge(svcBackends, int64(s.Down), "health", "down", "service", s.Name)
		t.gauge(svcBackends, int64(s.Unknown), "health", "unknown", "service", s.Name)
		t.gauge(svcBackends, int64(s.Up), "health", "up", "service", s.Name)
	})
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
