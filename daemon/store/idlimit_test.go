package store

import (
	"testing"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// openHolding opens a store that holds released IDs for the datapath, with the
// given limits, and follows the Seq of its changes.
func openHolding(t *testing.T, lim Limits) (*Store, func() uint64) {
	t.Helper()
	s, err := Open(Options{Limits: lim, HoldIDs: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	seqs := make(chan uint64, 100)
	_, _, stop := s.SnapshotAndListen(func(evs []Event) {
		for _, ev := range evs {
			seqs <- ev.Seq
		}
	})
	t.Cleanup(stop)
	last := func() uint64 {
		var seq uint64
		for {
			select {
			case q := <-seqs:
				seq = max(seq, q)
			default:
				return seq
			}
		}
	}
	return s, last
}

// TestIDsStayWithinLimits: the datapath's ID-indexed maps hold IDs 1..limit. A service
// created at the limit while the ID of a deleted one waits for the datapath gets that
// ID once the datapath has removed its old owner, never one above the limit; if the
// datapath does not get there in time, the call says so and changes nothing. Backends
// likewise.
func TestIDsStayWithinLimits(t *testing.T) {
	defer func(d time.Duration) { heldIDWait = d }(heldIDWait)
	heldIDWait = 300 * time.Millisecond
	lim := DefaultLimits()
	lim.MaxServices, lim.MaxBackendsPerService, lim.MaxBackends = 2, 2, 3

	t.Run("service", func(t *testing.T) {
		s, last := openHolding(t, lim)
		for _, svc := range []*lbdv1.Service{testService("a", "203.0.113.1", "198.18.1.1"), testService("b", "203.0.113.2", "198.18.1.2")} {
			if _, err := s.CreateService(svc); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.DeleteService("a"); err != nil {
			t.Fatal(err)
		}
		// Nobody reconciles: the call waits, then is refused, and nothing changed.
		start := time.Now()
		_, err := s.CreateService(testService("c", "203.0.113.3"))
		if Code(err).String() != "Unavailable" || time.Since(start) < heldIDWait {
			t.Fatalf("create at the limit with a held ID, nobody reconciling: %v after %v; want UNAVAILABLE after %v", err, time.Since(start), heldIDWait)
		}
		t.Log(err)
		if _, err := s.GetService("c"); Code(err).String() != "NotFound" {
			t.Fatalf("a refused create left c: %v", err)
		}
		// The datapath catches up while the call waits: c gets a's ID.
		seq := last()
		go func() {
			time.Sleep(50 * time.Millisecond)
			s.Reconciled(seq)
		}()
		c, err := s.CreateService(testService("c", "203.0.113.3"))
		if err != nil {
			t.Fatal(err)
		}
		if c.Id < 1 || c.Id > uint32(lim.MaxServices) {
			t.Fatalf("c got ID %d, outside 1..%d", c.Id, lim.MaxServices)
		}
	})

	t.Run("backend", func(t *testing.T) {
		s, last := openHolding(t, lim)
		if _, err := s.CreateService(testService("a", "203.0.113.1", "198.18.1.1", "198.18.1.2")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.CreateService(testService("b", "203.0.113.2", "198.18.1.3")); err != nil {
			t.Fatal(err)
		}
		// 198.18.1.1 leaves a; 198.18.1.9 comes in the next change, while 198.18.1.1's
		// ID still waits for the datapath: three backends in all, the limit.
		if _, err := s.UpdateService(testService("a", "203.0.113.1", "198.18.1.2"), 0); err != nil {
			t.Fatal(err)
		}
		seq := last()
		go func() {
			time.Sleep(50 * time.Millisecond)
			s.Reconciled(seq)
		}()
		got, err := s.UpdateService(testService("a", "203.0.113.1", "198.18.1.2", "198.18.1.9"), 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range got.Backends {
			if b.Id < 1 || b.Id > uint32(lim.MaxBackends) {
				t.Fatalf("backend %s got ID %d, outside 1..%d", b.Address, b.Id, lim.MaxBackends)
			}
		}
	})

	t.Run("in one change", func(t *testing.T) {
		// IDs a change releases are not handed out in the same change: replacing every
		// service at the limit in one apply (or a backend by another at the backend
		// limit) is refused with the reason, not given IDs the maps cannot hold.
		s, _ := openHolding(t, lim)
		if _, err := s.ApplyServices("o", []*lbdv1.Service{testService("a", "203.0.113.1"), testService("b", "203.0.113.2")}); err != nil {
			t.Fatal(err)
		}
		_, err := s.ApplyServices("o", []*lbdv1.Service{testService("c", "203.0.113.3"), testService("d", "203.0.113.4")})
		if Code(err).String() != "FailedPrecondition" {
			t.Fatalf("apply replacing all services at the limit: %v; want FAILED_PRECONDITION", err)
		}
		t.Log(err)
		if got := names(s.ListServices("o")); len(got) != 2 || got[0] != "a" {
			t.Fatalf("a refused apply changed the services: %v", got)
		}
	})
}
