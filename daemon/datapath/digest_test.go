//go:build linux

package datapath

import (
	"context"
	"fmt"
	"github.com/lbd-dev/lbd/daemon/model/modeltest"
	"slices"
	"testing"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// TestTableDigests: the digest of what the maps hold is the same on two nodes whose
// tables send every flow to the same backend, whatever IDs they use; it differs with
// another hash seed, another usable backend set, and a table slot written behind lbd's
// back, until the verification repairs it.
func TestTableDigests(t *testing.T) {
	svcWith := func(svcID, firstBackendID uint32, drained int) *lbdv1.Service {
		var bes []*lbdv1.Backend
		for i := range 4 {
			state := active
			if i == drained {
				state = lbdv1.BackendState_BACKEND_STATE_DRAINING
			}
			bes = append(bes, backend(firstBackendID+uint32(i), fmt.Sprintf("198.18.10.%d", i+1), 8080, state))
		}
		return service(svcID, "web", "203.0.113.10", 80, 4093, bes...)
	}
	open := func(seed uint32, svc *lbdv1.Service) *Manager {
		n := newNode(t)
		cfg := n.config(1 << 12)
		cfg.HashSeed = seed
		m := n.open(t, cfg)
		if _, err := m.Sync(context.Background(), modeltest.All(svc)); err != nil {
			t.Fatal(err)
		}
		return m
	}
	digest := func(m *Manager) string {
		t.Helper()
		d, err := m.TableDigests()
		if err != nil {
			t.Fatal(err)
		}
		if len(d) != 1 || d["web"] == "" {
			t.Fatalf("digests %v, want one for web", d)
		}
		return d["web"]
	}

	a := open(42, svcWith(1, 1, -1))
	same := open(42, svcWith(7, 101, -1))
	if da, ds := digest(a), digest(same); da != ds {
		t.Errorf("same backends under other IDs: %s vs %s", da, ds)
	}
	if da, dd := digest(a), digest(open(43, svcWith(1, 1, -1))); da == dd {
		t.Error("another hash seed gives the same digest")
	}
	if da, dd := digest(a), digest(open(42, svcWith(1, 1, 2))); da == dd {
		t.Error("a drained backend (another table) gives the same digest")
	}

	before := digest(a)
	table, err := a.lb.MaglevTable(1)
	if err != nil {
		t.Fatal(err)
	}
	planted := slices.Clone(table)
	planted[0], planted[len(planted)-1] = planted[len(planted)-1], planted[0]
	if planted[0] == table[0] {
		t.Fatal("the planted change changes nothing: pick other slots")
	}
	if err := a.lb.SetMaglevTable(1, planted); err != nil {
		t.Fatal(err)
	}
	if d := digest(a); d == before {
		t.Error("a table changed behind lbd's back gives the same digest")
	}
	if _, err := a.Verify(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := digest(a); d != before {
		t.Errorf("after the repair: %s, want %s again", d, before)
	}
}
