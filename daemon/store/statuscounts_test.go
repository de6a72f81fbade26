package store

import (
	"net/netip"
	"reflect"
	"testing"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// TestStatusCounts: the counts give each service the state, usable backends and
// advertisement that ListServices says, its backends counted by the health ListServices
// shows, and each backend's health for the services asked for.
func TestStatusCounts(t *testing.T) {
	s := open(t, "")
	for _, svc := range []*lbdv1.Service{
		testService("web", "203.0.113.1", "198.18.0.1", "198.18.0.2", "198.18.0.3"),
		testService("dns", "203.0.113.2", "198.18.0.4"),
		testService("empty", "203.0.113.3"),
	} {
		if _, err := s.CreateService(svc); err != nil {
			t.Fatal(err)
		}
	}
	web, err := s.GetService("web")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ReportDatapath("web", web.Revision, 0, nil, nil); err != nil {
		t.Fatal(err)
	}
	for i, h := range []lbdv1.HealthState{lbdv1.HealthState_HEALTH_STATE_UP, lbdv1.HealthState_HEALTH_STATE_DOWN} {
		if err := s.SetBackendHealth("web", web.Backends[i].Id, &lbdv1.BackendHealth{State: h}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SetAdvertised("web", true, "advertised"); err != nil {
		t.Fatal(err)
	}
	s.SetNodeReachability(map[netip.Addr]NodeReach{netip.MustParseAddr("198.18.0.3"): {Reachable: false, Reason: "no route"}})
	full, counts := s.ListServices(""), s.StatusCounts(func(name string) bool { return name == "web" })
	if len(full) != len(counts) {
		t.Fatalf("%d services, want %d", len(counts), len(full))
	}
	for i, f := range full {
		c := counts[i]
		want := StatusCounts{Name: f.Name, State: f.Status.State, Usable: int(f.Status.UsableBackends), Advertised: f.Status.Advertised}
		for _, b := range f.Backends {
			switch b.Health.GetState() {
			case lbdv1.HealthState_HEALTH_STATE_UP:
				want.Up++
			case lbdv1.HealthState_HEALTH_STATE_DOWN:
				want.Down++
			default:
				want.Unknown++
			}
			if f.Name == "web" {
				want.Backends = append(want.Backends, BackendHealth{b.Address, b.Port, b.Health.GetState()})
			}
		}
		if !reflect.DeepEqual(c, want) {
			t.Errorf("service %s: %+v, want %+v", f.Name, c, want)
		}
	}
	// web is not a service of defaults: one usable backend (one down, one unreachable).
	if w := counts[2]; w.Usable != 1 || w.Up != 1 || w.Down != 1 || w.Unknown != 1 || !w.Advertised || len(w.Backends) != 3 {
		t.Errorf("web: %+v", w)
	}
}
