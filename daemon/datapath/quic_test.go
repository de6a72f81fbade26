//go:build linux

package datapath

import (
	"context"
	"github.com/lbd-dev/lbd/daemon/model/modeltest"
	"maps"
	"testing"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// quicService is a QUIC-aware UDP service whose backends 1-3 have server IDs a1 01,
// a1 02, a1 03; backend 2 is in state s2.
func quicService(s2 lbdv1.BackendState) *lbdv1.Service {
	svc := service(1, "h3", "203.0.113.10", 443, 251,
		backend(1, "198.18.10.1", 443, active), backend(2, "198.18.10.2", 443, s2), backend(3, "198.18.10.3", 443, active))
	svc.Protocol = lbdv1.Protocol_PROTOCOL_UDP
	svc.Quic = &lbdv1.QuicRouting{ConfigId: 2, ServerIdLength: 2}
	for i, b := range svc.Backends {
		b.QuicServerId = []byte{0xa1, byte(i + 1)}
	}
	return svc
}

// serverIDs reads the server IDs of service 1 from the map.
func serverIDs(t *testing.T, m *Manager) map[string]uint32 {
	t.Helper()
	ids, err := m.lb.QUICServerIDs(map[uint32]uint8{1: 2})
	if err != nil {
		t.Fatal(err)
	}
	return ids[1]
}

// TestQUICServerIDs: the server IDs in the map follow the backends: a draining backend
// keeps its own (its connections go on), a disabled or removed one loses it, a service
// whose QUIC routing is turned off keeps none; a restart writes nothing, and an ID
// changed behind lbd's back is repaired by verification.
func TestQUICServerIDs(t *testing.T) {
	ctx := context.Background()
	n := newNode(t)
	m := n.open(t, n.config(1<<16))
	all := map[string]uint32{"\xa1\x01": 1, "\xa1\x02": 2, "\xa1\x03": 3}
	steps := []struct {
		name string
		svc  *lbdv1.Service
		want map[string]uint32
	}{
		{"created", quicService(active), all},
		{"backend 2 draining", quicService(lbdv1.BackendState_BACKEND_STATE_DRAINING), all},
		{"backend 2 disabled", quicService(lbdv1.BackendState_BACKEND_STATE_DISABLED), map[string]uint32{"\xa1\x01": 1, "\xa1\x03": 3}},
		{"backend 2 back", quicService(active), all},
		{"backend 3 removed", func() *lbdv1.Service { s := quicService(active); s.Backends = s.Backends[:2]; return s }(),
			map[string]uint32{"\xa1\x01": 1, "\xa1\x02": 2}},
		{"backend 1 renumbered", func() *lbdv1.Service {
			s := quicService(active)
			s.Backends[0].QuicServerId = []byte{0xa1, 9}
			return s
		}(),
			map[string]uint32{"\xa1\x09": 1, "\xa1\x02": 2, "\xa1\x03": 3}},
		{"quic off", func() *lbdv1.Service { s := quicService(active); s.Quic = nil; return s }(), nil},
		{"quic on again", quicService(active), all},
	}
	for _, s := range steps {
		if _, err := m.Upsert(ctx, modeltest.Of(s.svc)); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := serverIDs(t, m); !maps.Equal(got, s.want) {
			t.Errorf("%s: server IDs %x, want %x", s.name, got, s.want)
		}
	}

	m.Close()
	m = n.open(t, n.config(1<<16))
	if _, err := m.Sync(ctx, modeltest.All(quicService(active))); err != nil {
		t.Fatal(err)
	}
	if w := m.MapWrites(); w != 0 {
		t.Errorf("the sync after a restart wrote %d entries, want none", w)
	}

	if err := m.lb.DeleteQUICServerID(1, []byte{0xa1, 0x02}); err != nil {
		t.Fatal(err)
	}
	if err := m.lb.SetQUICServerID(1, []byte{0xa1, 0x07}, 3); err != nil {
		t.Fatal(err)
	}
	drift, err := m.Verify(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kinds := 0
	for _, d := range drift {
		if d.Kind == "quic_server_id" {
			kinds++
		}
	}
	if kinds != 2 {
		t.Errorf("verification reported %d server ID drifts (%v), want 2", kinds, drift)
	}
	if got := serverIDs(t, m); !maps.Equal(got, all) {
		t.Errorf("after verification: server IDs %x, want %x", got, all)
	}

	if err := m.Delete(ctx, modeltest.Of(quicService(active))); err != nil {
		t.Fatal(err)
	}
	if got := serverIDs(t, m); len(got) != 0 {
		t.Errorf("server IDs %x left by a removed service", got)
	}
}
