package lbd_test

import (
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

const (
	restartServices = 1000
	restartBackends = 10
	// Services below createdOneByOne go through CreateService; the rest through
	// ApplyServices, applyChunk services per owner and call.
	createdOneByOne = 250
	applyChunk      = 250
)

// restartService returns service i of the restart test. The services vary every option
// that is persisted, so a field lost on the way to disk and back shows up; every 100th is
// IPv6.
func restartService(i int) *lbdv1.Service {
	svc := &lbdv1.Service{
		Name:     fmt.Sprintf("svc-%04d", i),
		Protocol: lbdv1.Protocol_PROTOCOL_TCP,
	}
	ipv6 := i%100 == 42
	if ipv6 {
		svc.Vip, svc.Port = fmt.Sprintf("2001:db8:f00::%x", i+1), 443
	} else {
		// (i%200, i/200) is unique per i, so no two services share a frontend.
		svc.Vip, svc.Port = fmt.Sprintf("203.0.113.%d", i%200+1), uint32(80+i/200)
		if i%2 == 1 {
			svc.Protocol = lbdv1.Protocol_PROTOCOL_UDP
		}
	}
	switch i % 6 {
	case 0:
		svc.SessionAffinity = &lbdv1.SessionAffinity{Timeout: durationpb.New(3 * time.Hour)}
	case 1:
		svc.MaglevTableSize = 251
	case 2:
		svc.HashMode = lbdv1.HashMode_HASH_MODE_SOURCE_ADDRESS
		svc.NoBackendAction = lbdv1.NoBackendAction_NO_BACKEND_ACTION_DROP
		svc.AdvertisePolicy = lbdv1.AdvertisePolicy_ADVERTISE_POLICY_ALWAYS
	case 3:
		svc.HealthCheck = &lbdv1.HealthCheck{Type: lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_HTTP, Path: "/healthz", Rise: 3}
	case 4:
		if ipv6 {
			svc.SourceRanges = []string{"2001:db8:c000::/40"}
		} else {
			svc.SourceRanges = []string{"203.0.113.0/24", "198.18.0.0/15"}
		}
	case 5:
		svc.ResetFlowsOnBackendDown = true
		svc.HealthCheck = &lbdv1.HealthCheck{Type: lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_TCP, Port: 9000}
	}
	for j := range restartBackends {
		k := i*restartBackends + j
		b := &lbdv1.Backend{Port: uint32(8080 + j), Weight: uint32(1 + j%3)}
		if ipv6 {
			b.Address = fmt.Sprintf("2001:db8:1:%x::%x", i, j+1)
		} else {
			b.Address = fmt.Sprintf("198.18.%d.%d", k/250, k%250+1)
			if j%3 == 0 {
				b.NodeAddress = fmt.Sprintf("198.19.%d.%d", k/250, k%250+1)
			}
		}
		switch {
		case j == 9 && i%5 == 0:
			b.State = lbdv1.BackendState_BACKEND_STATE_DRAINING
		case j == 8 && i%7 == 0:
			b.State = lbdv1.BackendState_BACKEND_STATE_DISABLED
		}
		svc.Backends = append(svc.Backends, b)
	}
	return svc
}

// TestRestartKeepsState programs 1,000 services × 10 backends through both write paths of
// the API, kills lbd with SIGKILL (no chance to flush anything), starts it again on the
// same state directory, and expects the very same services, IDs and revisions back.
func TestRestartKeepsState(t *testing.T) {
	in := newInstance(t)
	p, conn := startLBD(t, in)
	lb := lbdv1.NewLoadBalancerServiceClient(conn)
	ctx := ctxT(t)

	// Services created and deleted first leave holes in the service and backend IDs; a
	// restored ID allocator must neither lose the holes nor hand out a used ID.
	for i := range 3 {
		tmp := restartService(restartServices + i)
		tmp.Name = fmt.Sprintf("tmp-%d", i)
		tmp.Vip = fmt.Sprintf("203.0.113.%d", 240+i)
		if _, err := lb.CreateService(ctx, &lbdv1.CreateServiceRequest{Service: tmp}); err != nil {
			t.Fatalf("create %s: %v", tmp.Name, err)
		}
	}

	created := map[string]*lbdv1.Service{}
	for i := range createdOneByOne {
		svc := restartService(i)
		if i%2 == 0 {
			svc.Owner = "operator"
		}
		res, err := lb.CreateService(ctx, &lbdv1.CreateServiceRequest{Service: svc})
		if err != nil {
			t.Fatalf("create %s: %v", svc.Name, err)
		}
		created[svc.Name] = res.Service
	}
	apply := func(owner string, from int, edit func(int, *lbdv1.Service)) *lbdv1.ApplyServicesResponse {
		t.Helper()
		req := &lbdv1.ApplyServicesRequest{Owner: owner}
		for i := from; i < from+applyChunk; i++ {
			svc := restartService(i)
			if edit != nil {
				edit(i, svc)
			}
			req.Services = append(req.Services, svc)
		}
		res, err := lb.ApplyServices(ctx, req)
		if err != nil {
			t.Fatalf("apply services of %s: %v", owner, err)
		}
		return res
	}
	for from := createdOneByOne; from < restartServices; from += applyChunk {
		owner := fmt.Sprintf("cluster-%d", from/applyChunk)
		if res := apply(owner, from, nil); res.Created != applyChunk {
			t.Fatalf("apply services of %s: %v, want %d created", owner, res, applyChunk)
		}
	}

	// Later revisions: an ApplyServices that updates part of an owner's services, and
	// backend edits that free some backend IDs and allocate others.
	bumped := 0
	res := apply("cluster-2", 2*applyChunk, func(i int, svc *lbdv1.Service) {
		if i%25 == 0 {
			svc.Backends[0].Weight = 7
			bumped++
		}
	})
	if int(res.Updated) != bumped || int(res.Unchanged) != applyChunk-bumped {
		t.Fatalf("re-apply services of cluster-2: %v, want %d updated", res, bumped)
	}
	for i := 0; i < 50; i += 10 {
		name := fmt.Sprintf("svc-%04d", i)
		old := restartService(i).Backends[0]
		if _, err := lb.DeleteBackend(ctx, &lbdv1.DeleteBackendRequest{ServiceName: name, Address: old.Address, Port: old.Port}); err != nil {
			t.Fatalf("delete backend of %s: %v", name, err)
		}
		nb := &lbdv1.Backend{Address: fmt.Sprintf("198.18.200.%d", i+1), Port: 8080, Weight: 2}
		if _, err := lb.CreateBackend(ctx, &lbdv1.CreateBackendRequest{ServiceName: name, Backend: nb}); err != nil {
			t.Fatalf("create backend of %s: %v", name, err)
		}
	}
	for i := range 3 {
		if _, err := lb.DeleteService(ctx, &lbdv1.DeleteServiceRequest{Name: fmt.Sprintf("tmp-%d", i)}); err != nil {
			t.Fatalf("delete tmp-%d: %v", i, err)
		}
	}

	bgp := lbdv1.NewBgpServiceClient(conn)
	for _, peer := range []*lbdv1.BgpPeer{
		{Address: "198.18.255.1", PeerAs: 65001, Password: "not-listed"},
		{Address: "2001:db8::ffff", PeerAs: 65002, HoldTime: durationpb.New(30 * time.Second), GracefulRestart: true},
	} {
		if _, err := bgp.CreateBgpPeer(ctx, &lbdv1.CreateBgpPeerRequest{Peer: peer}); err != nil {
			t.Fatalf("create BGP peer %s: %v", peer.Address, err)
		}
	}
	node := lbdv1.NewNodeServiceClient(conn)
	if _, err := node.DrainNode(ctx, &lbdv1.DrainNodeRequest{}); err != nil {
		t.Fatalf("drain node: %v", err)
	}

	before := snapshot(t, conn)
	if len(before.services.Services) != restartServices {
		t.Fatalf("listed %d services before the restart, want %d", len(before.services.Services), restartServices)
	}
	for _, svc := range before.services.Services {
		if len(svc.Backends) != restartBackends {
			t.Fatalf("service %s has %d backends, want %d", svc.Name, len(svc.Backends), restartBackends)
		}
		if c := created[svc.Name]; c != nil && (c.Id != svc.Id || c.Revision > svc.Revision) {
			t.Fatalf("service %s: created with id %d revision %d, listed with id %d revision %d", svc.Name, c.Id, c.Revision, svc.Id, svc.Revision)
		}
	}
	t.Logf("ListServices of %d services × %d backends: %d bytes", restartServices, restartBackends, proto.Size(before.services))

	p.signal(t, syscall.SIGKILL)
	if code := p.wait(t, 10*time.Second); code != -1 {
		t.Fatalf("lbd exited with code %d after SIGKILL, want death by signal", code)
	}
	if _, err := os.Stat(in.socket); err != nil {
		t.Fatalf("a killed lbd cannot remove its socket, yet: %v", err)
	}

	// The killed daemon left its socket behind: the new one must replace it.
	_, conn = startLBD(t, in)
	after := snapshot(t, conn)
	if len(after.services.Services) != len(before.services.Services) {
		t.Fatalf("listed %d services after the restart, want %d", len(after.services.Services), len(before.services.Services))
	}
	diffs := 0
	for i, b := range before.services.Services {
		a := after.services.Services[i]
		if !proto.Equal(withoutUpdateTime(b), withoutUpdateTime(a)) {
			diffs++
			if diffs <= 3 {
				t.Errorf("service %d differs after the restart:\nbefore: %s\nafter:  %s", i, prototext.Format(b), prototext.Format(a))
			}
		}
	}
	if diffs > 0 {
		t.Fatalf("%d of %d services differ after the restart", diffs, len(before.services.Services))
	}
	if !proto.Equal(before.peers, after.peers) {
		t.Errorf("BGP peers differ after the restart:\nbefore: %s\nafter:  %s", prototext.Format(before.peers), prototext.Format(after.peers))
	}
	if b, a := before.node.Node, after.node.Node; !a.Drained || a.Services != b.Services || a.Backends != b.Backends {
		t.Errorf("node after the restart: %s, want drained with %d services and %d backends", prototext.Format(a), b.Services, b.Backends)
	}

	// IDs handed out after the restart must not collide with restored ones.
	svcIDs, beIDs := map[uint32]string{}, map[uint32]string{}
	for _, svc := range after.services.Services {
		svcIDs[svc.Id] = svc.Name
		for _, b := range svc.Backends {
			beIDs[b.Id] = svc.Name
		}
	}
	fresh := restartService(restartServices + 10)
	fresh.Name, fresh.Vip = "after-restart", "203.0.113.250"
	got, err := lbdv1.NewLoadBalancerServiceClient(conn).CreateService(ctxT(t), &lbdv1.CreateServiceRequest{Service: fresh})
	if err != nil {
		t.Fatalf("create a service after the restart: %v", err)
	}
	if other, dup := svcIDs[got.Service.Id]; dup {
		t.Errorf("new service got id %d, already used by %s", got.Service.Id, other)
	}
	for _, b := range got.Service.Backends {
		if other, dup := beIDs[b.Id]; dup {
			t.Errorf("new backend %s got id %d, already used by a backend of %s", b.Address, b.Id, other)
		}
	}
}

// state is what a client can read back of the desired state.
type state struct {
	services *lbdv1.ListServicesResponse
	peers    *lbdv1.ListBgpPeersResponse
	node     *lbdv1.GetNodeResponse
}

func snapshot(t *testing.T, conn *grpc.ClientConn) state {
	t.Helper()
	ctx := ctxT(t)
	var st state
	var err error
	if st.services, err = lbdv1.NewLoadBalancerServiceClient(conn).ListServices(ctx, &lbdv1.ListServicesRequest{}); err != nil {
		t.Fatalf("list services: %v", err)
	}
	if st.peers, err = lbdv1.NewBgpServiceClient(conn).ListBgpPeers(ctx, &lbdv1.ListBgpPeersRequest{}); err != nil {
		t.Fatalf("list BGP peers: %v", err)
	}
	if st.node, err = lbdv1.NewNodeServiceClient(conn).GetNode(ctx, &lbdv1.GetNodeRequest{}); err != nil {
		t.Fatalf("get node: %v", err)
	}
	return st
}

// withoutUpdateTime returns a copy of svc without the one field that legitimately changes across
// a restart: the time of the last status report.
func withoutUpdateTime(svc *lbdv1.Service) *lbdv1.Service {
	c := proto.Clone(svc).(*lbdv1.Service)
	if c.Status != nil {
		c.Status.UpdateTime = nil
	}
	return c
}
