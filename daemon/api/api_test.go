package api_test

import (
	"testing"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

func TestServiceLifecycleNormalizesAndKeepsIDs(t *testing.T) {
	c := start(t)
	in := web()
	in.Backends = append(in.Backends, &lbdv1.Backend{Address: "198.18.1.0", Port: 8080, NodeAddress: "2001:db8:ff::1", Weight: 3})
	in.SourceRanges = []string{"10.1.2.3/8"}
	in.HealthCheck = &lbdv1.HealthCheck{Type: lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_HTTP}
	got, err := c.lb.CreateService(ctx(t), &lbdv1.CreateServiceRequest{Service: in})
	if err != nil {
		t.Fatal(err)
	}
	s := got.Service
	if s.Id == 0 || s.Revision != 1 || s.MaglevTableSize != 0 || s.HashMode != lbdv1.HashMode_HASH_MODE_FIVE_TUPLE ||
		s.NoBackendAction != lbdv1.NoBackendAction_NO_BACKEND_ACTION_REJECT || s.AdvertisePolicy != lbdv1.AdvertisePolicy_ADVERTISE_POLICY_IF_HEALTHY {
		t.Errorf("defaults not made explicit: %v", s)
	}
	if s.SourceRanges[0] != "10.0.0.0/8" {
		t.Errorf("source range not canonical: %v", s.SourceRanges)
	}
	hc := s.HealthCheck
	if hc.Path != "/" || hc.Rise != 2 || hc.Fall != 3 || hc.Interval.AsDuration() != 5*time.Second || hc.Timeout.AsDuration() != 2*time.Second || hc.ExpectedStatusMin != 200 || hc.ExpectedStatusMax != 399 {
		t.Errorf("health check defaults: %v", hc)
	}
	wantOrder := []string{"198.18.1.0", "198.18.1.1", "198.18.1.2"}
	ids := map[string]uint32{}
	for i, b := range s.Backends {
		if b.Address != wantOrder[i] {
			t.Errorf("backend %d is %s, want %s (sorted)", i, b.Address, wantOrder[i])
		}
		if b.Id == 0 || b.State != lbdv1.BackendState_BACKEND_STATE_ACTIVE || b.Weight == 0 || b.NodeAddress == "" {
			t.Errorf("backend %d not normalized: %v", i, b)
		}
		ids[b.Address] = b.Id
	}
	if s.Backends[1].NodeAddress != "198.18.1.1" || s.Backends[0].NodeAddress != "2001:db8:ff::1" {
		t.Errorf("node addresses: %v", s.Backends)
	}
	if s.Status.State != lbdv1.ServiceState_SERVICE_STATE_PENDING || s.Status.Reason == "" || s.Status.UsableBackends != 3 {
		t.Errorf("status: %v", s.Status)
	}

	// Update: drop one backend, add one; the survivors keep their IDs.
	upd := proto.Clone(s).(*lbdv1.Service)
	upd.Backends = []*lbdv1.Backend{upd.Backends[1], {Address: "198.18.1.7", Port: 8080}, upd.Backends[2]}
	res, err := c.lb.UpdateService(ctx(t), &lbdv1.UpdateServiceRequest{Service: upd, ExpectedRevision: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.Service.Revision != 2 || res.Service.Id != s.Id {
		t.Errorf("revision %d id %d, want 2 and %d", res.Service.Revision, res.Service.Id, s.Id)
	}
	for _, b := range res.Service.Backends {
		if old, ok := ids[b.Address]; ok && b.Id != old {
			t.Errorf("backend %s changed ID %d → %d", b.Address, old, b.Id)
		}
		if b.Address == "198.18.1.7" && (b.Id == ids["198.18.1.1"] || b.Id == ids["198.18.1.2"]) {
			t.Errorf("new backend reuses a live ID %d", b.Id)
		}
	}
	// An update that changes nothing does not bump the revision.
	same, err := c.lb.UpdateService(ctx(t), &lbdv1.UpdateServiceRequest{Service: res.Service})
	if err != nil || same.Service.Revision != 2 {
		t.Errorf("no-op update: revision %d, err %v", same.GetService().GetRevision(), err)
	}
	if _, err := c.lb.DeleteService(ctx(t), &lbdv1.DeleteServiceRequest{Name: "web"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.lb.GetService(ctx(t), &lbdv1.GetServiceRequest{Name: "web"}); status.Code(err) != codes.NotFound {
		t.Errorf("get after delete: %v", err)
	}
}

func TestBackendVerbsAndStatusReasons(t *testing.T) {
	c := start(t)
	if _, err := c.lb.CreateService(ctx(t), &lbdv1.CreateServiceRequest{Service: web()}); err != nil {
		t.Fatal(err)
	}
	b, err := c.lb.CreateBackend(ctx(t), &lbdv1.CreateBackendRequest{ServiceName: "web", Backend: &lbdv1.Backend{Address: "198.18.1.3", Port: 8080, Weight: 5}})
	if err != nil || b.Backend.Id == 0 || b.Backend.Weight != 5 {
		t.Fatalf("create backend: %v %v", b, err)
	}
	for _, addr := range []string{"198.18.1.1", "198.18.1.2"} {
		if _, err := c.lb.UpdateBackend(ctx(t), &lbdv1.UpdateBackendRequest{ServiceName: "web", Backend: &lbdv1.Backend{Address: addr, Port: 8080, State: lbdv1.BackendState_BACKEND_STATE_DRAINING}}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := c.lb.GetBackend(ctx(t), &lbdv1.GetBackendRequest{ServiceName: "web", Address: "198.18.1.1", Port: 8080})
	if err != nil || got.Backend.State != lbdv1.BackendState_BACKEND_STATE_DRAINING {
		t.Fatalf("get backend: %v %v", got, err)
	}
	svc, _ := c.lb.GetService(ctx(t), &lbdv1.GetServiceRequest{Name: "web"})
	if svc.Service.Status.UsableBackends != 1 || svc.Service.Revision != 4 {
		t.Errorf("usable %d revision %d, want 1 and 4", svc.Service.Status.UsableBackends, svc.Service.Revision)
	}
	if _, err := c.lb.DeleteBackend(ctx(t), &lbdv1.DeleteBackendRequest{ServiceName: "web", Address: "198.18.1.3", Port: 8080}); err != nil {
		t.Fatal(err)
	}
	list, err := c.lb.ListBackends(ctx(t), &lbdv1.ListBackendsRequest{ServiceName: "web"})
	if err != nil || len(list.Backends) != 2 {
		t.Fatalf("list backends: %v %v", list, err)
	}
}

func TestApplyServicesReplacesOnlyTheOwnersServices(t *testing.T) {
	c := start(t)
	if _, err := c.lb.CreateService(ctx(t), &lbdv1.CreateServiceRequest{Service: web()}); err != nil {
		t.Fatal(err)
	}
	apply := func(owner string, svcs ...*lbdv1.Service) *lbdv1.ApplyServicesResponse {
		t.Helper()
		r, err := c.lb.ApplyServices(ctx(t), &lbdv1.ApplyServicesRequest{Owner: owner, Services: svcs})
		if err != nil {
			t.Fatalf("apply %s: %v", owner, err)
		}
		return r
	}
	want := func(r *lbdv1.ApplyServicesResponse, cr, up, del, un uint32) {
		t.Helper()
		if r.Created != cr || r.Updated != up || r.Deleted != del || r.Unchanged != un {
			t.Errorf("got %v, want created %d updated %d deleted %d unchanged %d", r, cr, up, del, un)
		}
	}
	want(apply("a", owned("a1", "203.0.113.51"), owned("a2", "203.0.113.52")), 2, 0, 0, 0)
	want(apply("b", owned("b1", "203.0.113.61")), 1, 0, 0, 0)
	a1, _ := c.lb.GetService(ctx(t), &lbdv1.GetServiceRequest{Name: "a1"})
	changed := owned("a1", "203.0.113.51")
	changed.Backends = append(changed.Backends, &lbdv1.Backend{Address: "198.18.4.2", Port: 80})
	// a2 leaves, a1 changes, a3 arrives, taking a2's frontend in the same call.
	want(apply("a", changed, owned("a3", "203.0.113.52")), 1, 1, 1, 0)
	want(apply("a", changed, owned("a3", "203.0.113.52")), 0, 0, 0, 2)
	a1b, _ := c.lb.GetService(ctx(t), &lbdv1.GetServiceRequest{Name: "a1"})
	if a1b.Service.Id != a1.Service.Id || a1b.Service.Backends[0].Id != a1.Service.Backends[0].Id {
		t.Errorf("IDs changed across apply: %v → %v", a1.Service, a1b.Service)
	}
	want(apply("a"), 0, 0, 2, 0)
	all, _ := c.lb.ListServices(ctx(t), &lbdv1.ListServicesRequest{})
	var names []string
	for _, s := range all.Services {
		names = append(names, s.Name+"/"+s.Owner)
	}
	if len(names) != 2 || names[0] != "b1/b" || names[1] != "web/" {
		t.Errorf("services after applies: %v", names)
	}
	onlyB, _ := c.lb.ListServices(ctx(t), &lbdv1.ListServicesRequest{Owner: "b"})
	if len(onlyB.Services) != 1 {
		t.Errorf("owner filter: %v", onlyB.Services)
	}
}

func TestWatchSendsSnapshotSyncedThenChanges(t *testing.T) {
	c := start(t)
	if _, err := c.lb.CreateService(ctx(t), &lbdv1.CreateServiceRequest{Service: web()}); err != nil {
		t.Fatal(err)
	}
	stream, err := c.lb.WatchServices(ctx(t), &lbdv1.WatchServicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	next := func() *lbdv1.WatchServicesResponse {
		t.Helper()
		ev, err := stream.Recv()
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		return ev
	}
	if ev := next(); ev.Type != lbdv1.WatchEventType_WATCH_EVENT_TYPE_ADDED || ev.Service.Name != "web" {
		t.Fatalf("first event %v", ev)
	}
	if ev := next(); ev.Type != lbdv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED {
		t.Fatalf("second event %v", ev)
	}
	if _, err := c.lb.CreateService(ctx(t), &lbdv1.CreateServiceRequest{Service: web6()}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.lb.UpdateBackend(ctx(t), &lbdv1.UpdateBackendRequest{ServiceName: "web", Backend: &lbdv1.Backend{Address: "198.18.1.1", Port: 8080, Weight: 2}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.lb.DeleteService(ctx(t), &lbdv1.DeleteServiceRequest{Name: "web6"}); err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		typ  lbdv1.WatchEventType
		name string
	}{
		{lbdv1.WatchEventType_WATCH_EVENT_TYPE_ADDED, "web6"},
		{lbdv1.WatchEventType_WATCH_EVENT_TYPE_MODIFIED, "web"},
		{lbdv1.WatchEventType_WATCH_EVENT_TYPE_DELETED, "web6"},
	} {
		if ev := next(); ev.Type != w.typ || ev.Service.Name != w.name {
			t.Fatalf("got %v %s, want %v %s", ev.Type, ev.Service.GetName(), w.typ, w.name)
		}
	}
}

func TestNodeDrainAndPeersHidePasswords(t *testing.T) {
	c := start(t)
	n, err := c.node.DrainNode(ctx(t), &lbdv1.DrainNodeRequest{})
	if err != nil || !n.Node.Drained {
		t.Fatalf("drain: %v %v", n, err)
	}
	got, _ := c.node.GetNode(ctx(t), &lbdv1.GetNodeRequest{})
	if !got.Node.Drained || got.Node.Version != "test" {
		t.Errorf("node: %v", got.Node)
	}
	if n, err := c.node.UndrainNode(ctx(t), &lbdv1.UndrainNodeRequest{}); err != nil || n.Node.Drained {
		t.Fatalf("undrain: %v %v", n, err)
	}
	p, err := c.bgp.CreateBgpPeer(ctx(t), &lbdv1.CreateBgpPeerRequest{Peer: &lbdv1.BgpPeer{Address: "2001:db8::1", PeerAs: 65000, Password: "s3cret", GracefulRestart: true}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Peer.Password != "" || p.Peer.Port != 179 || p.Peer.HoldTime.AsDuration() != 90*time.Second || p.Peer.KeepaliveInterval.AsDuration() != 30*time.Second || p.Peer.GracefulRestartTime.AsDuration() != 120*time.Second {
		t.Errorf("peer defaults or password leak: %v", p.Peer)
	}
	if p.Peer.Status.GetReason() == "" {
		t.Errorf("peer has no status reason")
	}
	upd := &lbdv1.BgpPeer{Address: "2001:db8::1", PeerAs: 65001, HoldTime: durationpb.New(9 * time.Second)}
	if u, err := c.bgp.UpdateBgpPeer(ctx(t), &lbdv1.UpdateBgpPeerRequest{Peer: upd}); err != nil || u.Peer.KeepaliveInterval.AsDuration() != 3*time.Second {
		t.Fatalf("update peer: %v %v", u, err)
	}
	list, _ := c.bgp.ListBgpPeers(ctx(t), &lbdv1.ListBgpPeersRequest{})
	if len(list.Peers) != 1 || list.Peers[0].PeerAs != 65001 {
		t.Errorf("peers: %v", list.Peers)
	}
	if _, err := c.bgp.DeleteBgpPeer(ctx(t), &lbdv1.DeleteBgpPeerRequest{Address: "2001:db8::1"}); err != nil {
		t.Fatal(err)
	}
}

// TestBgpRoutesWithoutSpeaker: like ListBgpPeers, ListBgpRoutes answers on a node that
// runs no BGP speaker: no route, and why.
func TestBgpRoutesWithoutSpeaker(t *testing.T) {
	c := start(t)
	resp, err := c.bgp.ListBgpRoutes(ctx(t), &lbdv1.ListBgpRoutesRequest{})
	if err != nil || !resp.NoSpeaker || len(resp.Routes) != 0 {
		t.Errorf("ListBgpRoutes without a speaker: %v, %v; want no routes and no_speaker", resp, err)
	}
}

func TestDatapathRPCsAnswerUnimplementedWithReason(t *testing.T) {
	c := start(t)
	calls := map[string]error{}
	_, calls["TraceFlow"] = c.lb.TraceFlow(ctx(t), &lbdv1.TraceFlowRequest{})
	_, calls["ListConnections"] = c.lb.ListConnections(ctx(t), &lbdv1.ListConnectionsRequest{})
	_, calls["GetStats"] = c.lb.GetStats(ctx(t), &lbdv1.GetStatsRequest{})
	_, calls["DetachNode"] = c.node.DetachNode(ctx(t), &lbdv1.DetachNodeRequest{})
	for name, err := range calls {
		if status.Code(err) != codes.Unimplemented || len(status.Convert(err).Message()) < 20 {
			t.Errorf("%s: %v, want Unimplemented with a reason", name, err)
		}
	}
}
