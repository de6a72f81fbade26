package store

import (
	"cmp"
	"slices"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// StatusCounts is a service's status in numbers: what the metrics export of it.
type StatusCounts struct {
	Name       string
	State      lbdv1.ServiceState
	Usable     int // backends that take new flows
	Advertised bool
	// Backends by health: up, down, unknown (not checked, or no verdict yet).
	Up, Down, Unknown int
	// Backends lists each backend's health, for the services asked for only.
	Backends []BackendHealth
}

// BackendHealth is one backend's health.
type BackendHealth struct {
	Address string
	Port    uint32
	Health  lbdv1.HealthState
}

// StatusCounts returns every service's status in numbers, sorted by name, and the
// health of each backend of the services backendsOf selects (none if it is nil). It
// copies no service: a metrics scrape of 10,000 services lists them at a fraction of
// ListServices' cost.
func (s *Store) StatusCounts(backendsOf func(name string) bool) []StatusCounts {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]StatusCounts, 0, len(s.services))
	for _, svc := range s.services {
		rt := s.status[svc.Spec.Name]
		c := StatusCounts{Name: svc.Spec.Name}
		list := backendsOf != nil && backendsOf(svc.Spec.Name)
		if list {
			c.Backends = make([]BackendHealth, len(svc.Backends))
		}
		t := s.tally(svc, rt, func(i int, h *lbdv1.BackendHealth, _ lbdv1.Reachability) {
			state := h.GetState()
			switch state {
			case lbdv1.HealthState_HEALTH_STATE_UP:
				c.Up++
			case lbdv1.HealthState_HEALTH_STATE_DOWN:
				c.Down++
			default:
				c.Unknown++
			}
			if list {
				b := svc.Spec.Backends[i]
				c.Backends[i] = BackendHealth{Address: b.Address, Port: b.Port, Health: state}
			}
		})
		c.Usable = t.usable
		c.State, _ = s.state(svc.Spec, rt, t, false)
		c.Advertised = rt != nil && rt.hasAdvertise && rt.advertised
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b StatusCounts) int { return cmp.Compare(a.Name, b.Name) })
	return out
}
