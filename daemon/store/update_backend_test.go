package store

import (
	"path/filepath"
	"strings"
	"testing"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// TestUpdateBackendFields: a masked update replaces only the named field, an unknown
// field or a backend in another state than required changes nothing, and an unmasked
// update replaces all three fields as before.
func TestUpdateBackendFields(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "state.pb"))
	if _, err := s.CreateService(testService("web", "203.0.113.1", "198.18.0.1")); err != nil {
		t.Fatal(err)
	}
	backend := func() *lbdv1.Backend {
		t.Helper()
		svc, err := s.GetService("web")
		if err != nil {
			t.Fatal(err)
		}
		return svc.Backends[0]
	}
	ref := func(b *lbdv1.Backend) *lbdv1.Backend {
		b.Address, b.Port = "198.18.0.1", 80
		return b
	}

	// Another client set the weight; a drain that names only the state keeps it.
	if _, err := s.UpdateBackendFields("web", ref(&lbdv1.Backend{Weight: 7}), BackendUpdate{Fields: []string{"weight"}}); err != nil {
		t.Fatal(err)
	}
	b, err := s.UpdateBackendFields("web", ref(&lbdv1.Backend{State: lbdv1.BackendState_BACKEND_STATE_DRAINING}),
		BackendUpdate{Fields: []string{"state"}})
	if err != nil {
		t.Fatal(err)
	}
	if b.Weight != 7 || b.State != lbdv1.BackendState_BACKEND_STATE_DRAINING || b.NodeAddress != "198.18.0.1" {
		t.Errorf("after weight 7 then a state-only drain: %v", b)
	}

	before := backend()
	for _, c := range []struct {
		name string
		u    BackendUpdate
		code codes.Code
		msg  string
	}{
		{"unknown field", BackendUpdate{Fields: []string{"address"}}, codes.InvalidArgument, "update_mask"},
		// The weight named with 0 is an error, not the default 1 (nor a drain).
		{"weight 0", BackendUpdate{Fields: []string{"weight", "state"}}, codes.InvalidArgument, "backend.weight: 0 is not a weight (1-256); to send a backend no new flows, drain it"},
		{"not from a draining backend", BackendUpdate{Fields: []string{"state"}, FromStates: []lbdv1.BackendState{lbdv1.BackendState_BACKEND_STATE_ACTIVE}},
			codes.FailedPrecondition, "is BACKEND_STATE_DRAINING"},
	} {
		_, err := s.UpdateBackendFields("web", ref(&lbdv1.Backend{State: lbdv1.BackendState_BACKEND_STATE_DISABLED}), c.u)
		if status.Code(err) != c.code || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want %v naming %s", c.name, err, c.code, c.msg)
		}
		if after := backend(); !proto.Equal(after, before) {
			t.Errorf("%s changed the backend: %v, was %v", c.name, after, before)
		}
	}

	// Without a mask every field is replaced: the weight falls back to its default.
	b, err = s.UpdateBackend("web", ref(&lbdv1.Backend{State: lbdv1.BackendState_BACKEND_STATE_ACTIVE}))
	if err != nil {
		t.Fatal(err)
	}
	if b.Weight != 1 || b.State != lbdv1.BackendState_BACKEND_STATE_ACTIVE {
		t.Errorf("unmasked update: %v, want weight 1 and active", b)
	}
}
