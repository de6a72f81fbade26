package store

import (
	"testing"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// withIDs gives a service the IDs a shared store would hold.
func withIDs(svc *lbdv1.Service, id uint32, rev uint64, backendIDs ...uint32) *lbdv1.Service {
	svc.Id, svc.Revision = id, rev
	for i, b := range svc.Backends {
		b.Id = backendIDs[i]
	}
	return svc
}

// TestApplySharedKeepsTheFleetsIDs: a shared change is applied with the IDs and
// revision it comes with, a full read removes what the fleet lacks, and an ID that a
// change released is reported held, for a change that reuses it, until the datapath
// applied the release.
func TestApplySharedKeepsTheFleetsIDs(t *testing.T) {
	s, err := Open(Options{Limits: DefaultLimits(), HoldIDs: true})
	if err != nil {
		t.Fatal(err)
	}
	var seq uint64
	_, _, stop := s.SnapshotAndListen(func(evs []Event) {
		for _, ev := range evs {
			seq = max(seq, ev.Seq)
		}
	})
	defer stop()
	always := func() bool { return true }
	x := withIDs(testService("x", "203.0.113.1", "198.18.1.1"), 7, 3, 9)
	if err := s.ApplyShared(false, []*lbdv1.Service{x}, nil, always); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetService("x")
	if err != nil || got.Id != 7 || got.Revision != 3 || got.Backends[0].Id != 9 {
		t.Fatalf("x as applied: %v, %v", got, err)
	}
	if err := s.ApplyShared(false, nil, []string{"x"}, func() bool { return false }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetService("x"); err != nil {
		t.Fatalf("a change its guard refused was applied: %v", err)
	}
	s.Reconciled(seq)
	// A full read without x removes it; its IDs wait for the datapath.
	if err := s.ApplyShared(true, nil, nil, always); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetService("x"); Code(err).String() != "NotFound" {
		t.Fatalf("x after a full read without it: %v", err)
	}
	y := withIDs(testService("y", "203.0.113.2", "198.18.1.2"), 7, 1, 9)
	if !s.SharedIDsHeld([]*lbdv1.Service{y}) {
		t.Fatal("y reuses x's IDs before the datapath released them, and they are not reported held")
	}
	s.Reconciled(seq)
	if s.SharedIDsHeld([]*lbdv1.Service{y}) {
		t.Fatal("x's IDs still held after the datapath applied their release")
	}
	if err := s.ApplyShared(false, []*lbdv1.Service{y}, nil, always); err != nil {
		t.Fatal(err)
	}
	// The store's own next IDs are past the fleet's.
	z, err := s.CreateService(testService("z", "203.0.113.3", "198.18.1.3"))
	if err != nil {
		t.Fatal(err)
	}
	if z.Id == 7 || z.Backends[0].Id == 9 {
		t.Fatalf("z got an ID of y: %d, backend %d", z.Id, z.Backends[0].Id)
	}
}
