package fleet

import (
	"testing"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// TestSpecDigest: what differs between nodes for one spec (IDs, revision, status,
// health, the owner) leaves the digest alone; every spec field changes it.
func TestSpecDigest(t *testing.T) {
	base := func() *lbdv1.Service {
		return &lbdv1.Service{Name: "web", Vip: "203.0.113.10", Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP, MaglevTableSize: 65537,
			Backends: []*lbdv1.Backend{{Address: "198.18.1.10", Port: 8080, NodeAddress: "198.18.1.10", Weight: 1, State: lbdv1.BackendState_BACKEND_STATE_ACTIVE}}}
	}
	want := SpecDigest(base())
	if len(want) != 2*digestLen {
		t.Fatalf("digest %q: want %d hex digits", want, 2*digestLen)
	}
	same := base()
	same.Id, same.Revision, same.Owner = 7, 42, "k8s"
	same.Status = &lbdv1.ServiceStatus{State: lbdv1.ServiceState_SERVICE_STATE_READY}
	same.Backends[0].Id, same.Backends[0].TableSlots = 9, 65537
	same.Backends[0].Health = &lbdv1.BackendHealth{State: lbdv1.HealthState_HEALTH_STATE_DOWN}
	if got := SpecDigest(same); got != want {
		t.Errorf("IDs, revision, owner, status and health changed the digest: %s vs %s", got, want)
	}
	for name, edit := range map[string]func(*lbdv1.Service){
		"port":   func(s *lbdv1.Service) { s.Port = 81 },
		"weight": func(s *lbdv1.Service) { s.Backends[0].Weight = 2 },
		"state":  func(s *lbdv1.Service) { s.Backends[0].State = lbdv1.BackendState_BACKEND_STATE_DRAINING },
		"node":   func(s *lbdv1.Service) { s.Backends[0].NodeAddress = "198.18.1.11" },
		"table":  func(s *lbdv1.Service) { s.MaglevTableSize = 251 },
	} {
		s := base()
		edit(s)
		if SpecDigest(s) == want {
			t.Errorf("a changed %s leaves the digest unchanged", name)
		}
	}
	ds := Digests([]*lbdv1.Service{base()}, map[string]string{"web": "aa", "#3": "bb"})
	if len(ds) != 2 || ds[0].Name != "#3" || ds[0].Spec != "" || ds[1].Table != "aa" || ds[1].Spec != want {
		t.Errorf("Digests: %v", ds)
	}
}
