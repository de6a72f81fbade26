package api_test

import (
	"strings"
	"testing"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

func web() *lbdv1.Service {
	return &lbdv1.Service{
		Name: "web", Vip: "203.0.113.10", Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP,
		Backends: []*lbdv1.Backend{{Address: "198.18.1.1", Port: 8080}, {Address: "198.18.1.2", Port: 8080}},
	}
}

func web6() *lbdv1.Service {
	return &lbdv1.Service{
		Name: "web6", Vip: "2001:db8::10", Port: 443, Protocol: lbdv1.Protocol_PROTOCOL_TCP,
		Backends: []*lbdv1.Backend{{Address: "2001:db8:1::1", Port: 8443}},
	}
}

// snapshot is everything the API can read back, to prove a rejected call changed nothing.
func snapshot(t *testing.T, c *clients) []proto.Message {
	t.Helper()
	svcs, err := c.lb.ListServices(ctx(t), &lbdv1.ListServicesRequest{})
	if err != nil {
		t.Fatalf("list services: %v", err)
	}
	peers, err := c.bgp.ListBgpPeers(ctx(t), &lbdv1.ListBgpPeersRequest{})
	if err != nil {
		t.Fatalf("list peers: %v", err)
	}
	node, err := c.node.GetNode(ctx(t), &lbdv1.GetNodeRequest{})
	if err != nil {
		t.Fatalf("get node: %v", err)
	}
	return []proto.Message{svcs, peers, node}
}

func sameSnapshot(a, b []proto.Message) bool {
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

type badCase struct {
	name  string
	prep  func(*clients) error // runs before the state is recorded
	call  func(*clients) error
	code  codes.Code
	field string // must appear in the message
}

func svcWith(f func(*lbdv1.Service)) *lbdv1.Service {
	s := web()
	s.Name = "new"
	s.Vip = "203.0.113.99"
	f(s)
	return s
}

// quicSvc is a QUIC-aware UDP service whose two backends have server IDs 0001 and 0002,
// changed by f.
func quicSvc(f func(*lbdv1.Service)) *lbdv1.Service {
	return svcWith(func(s *lbdv1.Service) {
		s.Name, s.Protocol, s.Port = "h3", lbdv1.Protocol_PROTOCOL_UDP, 443
		s.Quic = &lbdv1.QuicRouting{ConfigId: 1, ServerIdLength: 2}
		s.Backends[0].QuicServerId, s.Backends[1].QuicServerId = []byte{0, 1}, []byte{0, 2}
		f(s)
	})
}

func createQUIC(c *clients) error {
	_, err := c.lb.CreateService(bg(), &lbdv1.CreateServiceRequest{Service: quicSvc(func(*lbdv1.Service) {})})
	return err
}

func create(s *lbdv1.Service) func(*clients) error {
	return func(c *clients) error {
		_, err := c.lb.CreateService(bg(), &lbdv1.CreateServiceRequest{Service: s})
		return err
	}
}

func TestBadRequestsChangeNothing(t *testing.T) {
	hc := func(f func(*lbdv1.HealthCheck)) *lbdv1.Service {
		return svcWith(func(s *lbdv1.Service) {
			s.HealthCheck = &lbdv1.HealthCheck{Type: lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_HTTP}
			f(s.HealthCheck)
		})
	}
	backends := func(n int) []*lbdv1.Backend {
		var bs []*lbdv1.Backend
		for i := range n {
			bs = append(bs, &lbdv1.Backend{Address: "198.18.2." + itoa(i+1), Port: 80})
		}
		return bs
	}
	cases := []badCase{
		{"no service", nil, create(nil), codes.InvalidArgument, "service"},
		{"empty name", nil, create(svcWith(func(s *lbdv1.Service) { s.Name = "" })), codes.InvalidArgument, "service.name"},
		{"bad name", nil, create(svcWith(func(s *lbdv1.Service) { s.Name = "has space" })), codes.InvalidArgument, "service.name"},
		{"long name", nil, create(svcWith(func(s *lbdv1.Service) { s.Name = strings.Repeat("a", 254) })), codes.InvalidArgument, "service.name"},
		{"bad owner", nil, create(svcWith(func(s *lbdv1.Service) { s.Owner = "-x" })), codes.InvalidArgument, "service.owner"},
		{"no vip", nil, create(svcWith(func(s *lbdv1.Service) { s.Vip = "" })), codes.InvalidArgument, "service.vip"},
		{"vip not an address", nil, create(svcWith(func(s *lbdv1.Service) { s.Vip = "203.0.113" })), codes.InvalidArgument, "service.vip"},
		{"vip unspecified", nil, create(svcWith(func(s *lbdv1.Service) { s.Vip = "0.0.0.0" })), codes.InvalidArgument, "service.vip"},
		{"vip multicast", nil, create(svcWith(func(s *lbdv1.Service) { s.Vip = "ff02::1" })), codes.InvalidArgument, "service.vip"},
		{"vip loopback", nil, create(svcWith(func(s *lbdv1.Service) { s.Vip = "127.0.0.1" })), codes.InvalidArgument, "service.vip"},
		{"vip mapped", nil, create(svcWith(func(s *lbdv1.Service) { s.Vip = "::ffff:203.0.113.1" })), codes.InvalidArgument, "service.vip"},
		{"vip zone", nil, create(svcWith(func(s *lbdv1.Service) { s.Vip = "fe80::1%eth0" })), codes.InvalidArgument, "service.vip"},
		{"port too big", nil, create(svcWith(func(s *lbdv1.Service) { s.Port = 65536 })), codes.InvalidArgument, "service.port"},
		{"no protocol", nil, create(svcWith(func(s *lbdv1.Service) { s.Protocol = 0 })), codes.InvalidArgument, "service.protocol"},
		{"unknown protocol", nil, create(svcWith(func(s *lbdv1.Service) { s.Protocol = 9 })), codes.InvalidArgument, "service.protocol"},
		{"sctp backend on another port", nil, create(svcWith(func(s *lbdv1.Service) { s.Protocol = lbdv1.Protocol_PROTOCOL_SCTP })),
			codes.InvalidArgument, "service.backends[0].port"},
		{"sctp health check on the backend's port", nil, create(svcWith(func(s *lbdv1.Service) {
			s.Protocol, s.Port = lbdv1.Protocol_PROTOCOL_SCTP, 8080
			s.HealthCheck = &lbdv1.HealthCheck{Type: lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_TCP}
		})), codes.InvalidArgument, "service.health_check.port"},
		{"sctp backend added on another port", func(c *clients) error {
			_, err := c.lb.CreateService(bg(), &lbdv1.CreateServiceRequest{Service: svcWith(func(s *lbdv1.Service) {
				s.Name, s.Protocol, s.Port = "sctp", lbdv1.Protocol_PROTOCOL_SCTP, 8080
			})})
			return err
		}, func(c *clients) error {
			_, err := c.lb.CreateBackend(bg(), &lbdv1.CreateBackendRequest{ServiceName: "sctp", Backend: &lbdv1.Backend{Address: "198.18.1.9", Port: 9090}})
			return err
		}, codes.InvalidArgument, "backend.port"},
		{"quic on tcp", nil, create(svcWith(func(s *lbdv1.Service) { s.Quic = &lbdv1.QuicRouting{ServerIdLength: 2} })),
			codes.InvalidArgument, "service.quic"},
		{"quic unroutable config", nil, create(quicSvc(func(s *lbdv1.Service) { s.Quic.ConfigId = 7 })), codes.InvalidArgument, "service.quic.config_id"},
		{"quic no server id length", nil, create(quicSvc(func(s *lbdv1.Service) { s.Quic.ServerIdLength = 0 })), codes.InvalidArgument, "service.quic.server_id_length"},
		{"quic server id too long", nil, create(quicSvc(func(s *lbdv1.Service) { s.Quic.ServerIdLength = 16 })), codes.InvalidArgument, "service.quic.server_id_length"},
		{"quic server id without quic", nil, create(quicSvc(func(s *lbdv1.Service) { s.Quic = nil })), codes.InvalidArgument, "service.backends[0].quic_server_id"},
		{"quic server id length", nil, create(quicSvc(func(s *lbdv1.Service) { s.Backends[1].QuicServerId = []byte{1, 2, 3} })),
			codes.InvalidArgument, "service.backends[1].quic_server_id"},
		{"quic server id twice", nil, create(quicSvc(func(s *lbdv1.Service) { s.Backends[1].QuicServerId = s.Backends[0].QuicServerId })),
			codes.InvalidArgument, "service.backends[1].quic_server_id"},
		{"quic server id of another backend added", createQUIC, func(c *clients) error {
			_, err := c.lb.CreateBackend(bg(), &lbdv1.CreateBackendRequest{ServiceName: "h3",
				Backend: &lbdv1.Backend{Address: "198.18.1.9", Port: 8080, QuicServerId: []byte{0, 1}}})
			return err
		}, codes.InvalidArgument, "backend.quic_server_id"},
		{"quic server id of another backend set", createQUIC, func(c *clients) error {
			_, err := c.lb.UpdateBackend(bg(), &lbdv1.UpdateBackendRequest{ServiceName: "h3",
				Backend:    &lbdv1.Backend{Address: "198.18.1.2", Port: 8080, QuicServerId: []byte{0, 1}},
				UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"quic_server_id"}}})
			return err
		}, codes.InvalidArgument, "backend.quic_server_id"},
		{"table not prime", nil, create(svcWith(func(s *lbdv1.Service) { s.MaglevTableSize = 65536 })), codes.InvalidArgument, "service.maglev_table_size"},
		{"table too small", nil, create(svcWith(func(s *lbdv1.Service) { s.MaglevTableSize = 7 })), codes.InvalidArgument, "service.maglev_table_size"},
		{"table too big", nil, create(svcWith(func(s *lbdv1.Service) { s.MaglevTableSize = 1000003 })), codes.InvalidArgument, "service.maglev_table_size"},
		{"hash mode", nil, create(svcWith(func(s *lbdv1.Service) { s.HashMode = 7 })), codes.InvalidArgument, "service.hash_mode"},
		{"no backend action", nil, create(svcWith(func(s *lbdv1.Service) { s.NoBackendAction = 7 })), codes.InvalidArgument, "service.no_backend_action"},
		{"advertise policy", nil, create(svcWith(func(s *lbdv1.Service) { s.AdvertisePolicy = 7 })), codes.InvalidArgument, "service.advertise_policy"},
		{"affinity no timeout", nil, create(svcWith(func(s *lbdv1.Service) { s.SessionAffinity = &lbdv1.SessionAffinity{} })), codes.InvalidArgument, "service.session_affinity.timeout"},
		{"affinity too long", nil, create(svcWith(func(s *lbdv1.Service) {
			s.SessionAffinity = &lbdv1.SessionAffinity{Timeout: durationpb.New(25 * time.Hour)}
		})), codes.InvalidArgument, "service.session_affinity.timeout"},
		{"affinity fraction", nil, create(svcWith(func(s *lbdv1.Service) {
			s.SessionAffinity = &lbdv1.SessionAffinity{Timeout: durationpb.New(1500 * time.Millisecond)}
		})), codes.InvalidArgument, "service.session_affinity.timeout"},
		{"source range bad", nil, create(svcWith(func(s *lbdv1.Service) { s.SourceRanges = []string{"10.0.0.0/33"} })), codes.InvalidArgument, "service.source_ranges[0]"},
		{"source range family", nil, create(svcWith(func(s *lbdv1.Service) { s.SourceRanges = []string{"10.0.0.0/8", "2001:db8::/32"} })), codes.InvalidArgument, "service.source_ranges[1]"},
		{"source range dup", nil, create(svcWith(func(s *lbdv1.Service) { s.SourceRanges = []string{"10.0.0.0/8", "10.1.0.0/8"} })), codes.InvalidArgument, "service.source_ranges[1]"},
		{"too many source ranges", nil, create(svcWith(func(s *lbdv1.Service) {
			s.SourceRanges = []string{"10.0.0.0/8", "11.0.0.0/8", "12.0.0.0/8", "13.0.0.0/8", "14.0.0.0/8"}
		})), codes.InvalidArgument, "service.source_ranges"},
		{"hc no type", nil, create(hc(func(h *lbdv1.HealthCheck) { h.Type = 0 })), codes.InvalidArgument, "service.health_check.type"},
		{"hc path", nil, create(hc(func(h *lbdv1.HealthCheck) { h.Path = "healthz" })), codes.InvalidArgument, "service.health_check.path"},
		{"hc tcp path", nil, create(hc(func(h *lbdv1.HealthCheck) { h.Type = lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_TCP; h.Path = "/x" })), codes.InvalidArgument, "service.health_check.path"},
		{"hc port", nil, create(hc(func(h *lbdv1.HealthCheck) { h.Port = 70000 })), codes.InvalidArgument, "service.health_check.port"},
		{"hc timeout ≥ interval", nil, create(hc(func(h *lbdv1.HealthCheck) {
			h.Interval, h.Timeout = durationpb.New(time.Second), durationpb.New(time.Second)
		})), codes.InvalidArgument, "service.health_check.timeout"},
		{"hc interval", nil, create(hc(func(h *lbdv1.HealthCheck) { h.Interval = durationpb.New(time.Millisecond) })), codes.InvalidArgument, "service.health_check.interval"},
		{"hc rise", nil, create(hc(func(h *lbdv1.HealthCheck) { h.Rise = 1000 })), codes.InvalidArgument, "service.health_check.rise"},
		{"hc fall", nil, create(hc(func(h *lbdv1.HealthCheck) { h.Fall = 1000 })), codes.InvalidArgument, "service.health_check.fall"},
		{"hc status range", nil, create(hc(func(h *lbdv1.HealthCheck) { h.ExpectedStatusMin, h.ExpectedStatusMax = 500, 200 })), codes.InvalidArgument, "service.health_check.expected_status_min"},
		{"hc skip verify on http", nil, create(hc(func(h *lbdv1.HealthCheck) { h.InsecureSkipVerify = true })), codes.InvalidArgument, "service.health_check.insecure_skip_verify"},
		{"backend no address", nil, create(svcWith(func(s *lbdv1.Service) { s.Backends[1].Address = "" })), codes.InvalidArgument, "service.backends[1].address"},
		{"backend bad address", nil, create(svcWith(func(s *lbdv1.Service) { s.Backends[1].Address = "198.18.1" })), codes.InvalidArgument, "service.backends[1].address"},
		{"backend family", nil, create(svcWith(func(s *lbdv1.Service) { s.Backends[0].Address = "2001:db8::1" })), codes.InvalidArgument, "service.backends[0].address"},
		{"backend port missing", nil, create(svcWith(func(s *lbdv1.Service) { s.Backends[0].Port = 0 })), codes.InvalidArgument, "service.backends[0].port"},
		{"backend port on wildcard", nil, create(svcWith(func(s *lbdv1.Service) { s.Port = 0 })), codes.InvalidArgument, "service.backends[0].port"},
		{"backend port too big", nil, create(svcWith(func(s *lbdv1.Service) { s.Backends[0].Port = 65536 })), codes.InvalidArgument, "service.backends[0].port"},
		{"backend node address", nil, create(svcWith(func(s *lbdv1.Service) { s.Backends[0].NodeAddress = "node1" })), codes.InvalidArgument, "service.backends[0].node_address"},
		{"backend weight", nil, create(svcWith(func(s *lbdv1.Service) { s.Backends[0].Weight = 257 })), codes.InvalidArgument, "service.backends[0].weight"},
		{"backend state", nil, create(svcWith(func(s *lbdv1.Service) { s.Backends[0].State = 9 })), codes.InvalidArgument, "service.backends[0].state"},
		{"backend duplicate", nil, create(svcWith(func(s *lbdv1.Service) { s.Backends[1].Address = "198.18.1.1" })), codes.InvalidArgument, "service.backends[1]"},
		{"too many backends", nil, create(svcWith(func(s *lbdv1.Service) { s.Backends = backends(9) })), codes.InvalidArgument, "service.backends"},
		{"weights over table", nil, create(svcWith(func(s *lbdv1.Service) {
			s.MaglevTableSize = 251
			s.Backends = backends(1)
			s.Backends[0].Weight = 256
		})), codes.InvalidArgument, "service.backends"},
		{"duplicate name", nil, create(svcWith(func(s *lbdv1.Service) { s.Name = "web" })), codes.AlreadyExists, "service.name"},
		{"duplicate frontend", nil, create(svcWith(func(s *lbdv1.Service) { s.Vip = "203.0.113.10" })), codes.AlreadyExists, "service.vip"},
		{"update missing", nil, func(c *clients) error {
			_, err := c.lb.UpdateService(bg(), &lbdv1.UpdateServiceRequest{Service: svcWith(func(*lbdv1.Service) {})})
			return err
		}, codes.NotFound, "new"},
		{"update stale revision", nil, func(c *clients) error {
			_, err := c.lb.UpdateService(bg(), &lbdv1.UpdateServiceRequest{Service: web(), ExpectedRevision: 99})
			return err
		}, codes.FailedPrecondition, "expected_revision"},
		{"update owner", nil, func(c *clients) error {
			s := web()
			s.Owner = "someone"
			_, err := c.lb.UpdateService(bg(), &lbdv1.UpdateServiceRequest{Service: s})
			return err
		}, codes.FailedPrecondition, "service.owner"},
		{"update frontend taken", nil, func(c *clients) error {
			s := web()
			s.Vip, s.Port = "203.0.113.20", 53
			s.Protocol = lbdv1.Protocol_PROTOCOL_UDP
			_, err := c.lb.UpdateService(bg(), &lbdv1.UpdateServiceRequest{Service: s})
			return err
		}, codes.AlreadyExists, "service.vip"},
		{"update invalid", nil, func(c *clients) error {
			s := web()
			s.Backends[0].Port = 0
			_, err := c.lb.UpdateService(bg(), &lbdv1.UpdateServiceRequest{Service: s})
			return err
		}, codes.InvalidArgument, "service.backends[0].port"},
		{"delete missing", nil, func(c *clients) error {
			_, err := c.lb.DeleteService(bg(), &lbdv1.DeleteServiceRequest{Name: "nope"})
			return err
		}, codes.NotFound, "nope"},
		{"get missing", nil, func(c *clients) error {
			_, err := c.lb.GetService(bg(), &lbdv1.GetServiceRequest{Name: "nope"})
			return err
		}, codes.NotFound, "nope"},
		{"backend add to missing service", nil, func(c *clients) error {
			_, err := c.lb.CreateBackend(bg(), &lbdv1.CreateBackendRequest{ServiceName: "nope", Backend: &lbdv1.Backend{Address: "198.18.1.9", Port: 80}})
			return err
		}, codes.NotFound, "nope"},
		{"backend add duplicate", nil, func(c *clients) error {
			_, err := c.lb.CreateBackend(bg(), &lbdv1.CreateBackendRequest{ServiceName: "web", Backend: &lbdv1.Backend{Address: "198.18.1.1", Port: 8080}})
			return err
		}, codes.AlreadyExists, "backend.address"},
		{"backend add wrong family", nil, func(c *clients) error {
			_, err := c.lb.CreateBackend(bg(), &lbdv1.CreateBackendRequest{ServiceName: "web", Backend: &lbdv1.Backend{Address: "2001:db8::5", Port: 80}})
			return err
		}, codes.InvalidArgument, "backend.address"},
		{"backend add over limit", func(c *clients) error {
			for i := range 6 {
				if _, err := c.lb.CreateBackend(bg(), &lbdv1.CreateBackendRequest{ServiceName: "web", Backend: &lbdv1.Backend{Address: "198.18.3." + itoa(i+1), Port: 80}}); err != nil {
					return err
				}
			}
			return nil
		}, func(c *clients) error {
			_, err := c.lb.CreateBackend(bg(), &lbdv1.CreateBackendRequest{ServiceName: "web", Backend: &lbdv1.Backend{Address: "198.18.3.99", Port: 80}})
			return err
		}, codes.FailedPrecondition, "limit"},
		{"backend update missing", nil, func(c *clients) error {
			_, err := c.lb.UpdateBackend(bg(), &lbdv1.UpdateBackendRequest{ServiceName: "web", Backend: &lbdv1.Backend{Address: "198.18.1.9", Port: 8080}})
			return err
		}, codes.NotFound, "198.18.1.9:8080"},
		{"backend update bad weight", nil, func(c *clients) error {
			_, err := c.lb.UpdateBackend(bg(), &lbdv1.UpdateBackendRequest{ServiceName: "web", Backend: &lbdv1.Backend{Address: "198.18.1.1", Port: 8080, Weight: 1000}})
			return err
		}, codes.InvalidArgument, "backend.weight"},
		{"backend update unknown mask path", nil, func(c *clients) error {
			_, err := c.lb.UpdateBackend(bg(), &lbdv1.UpdateBackendRequest{ServiceName: "web", Backend: &lbdv1.Backend{Address: "198.18.1.1", Port: 8080},
				UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"address"}}})
			return err
		}, codes.InvalidArgument, "update_mask"},
		{"backend update from a state it is not in", nil, func(c *clients) error {
			_, err := c.lb.UpdateBackend(bg(), &lbdv1.UpdateBackendRequest{ServiceName: "web",
				Backend:        &lbdv1.Backend{Address: "198.18.1.1", Port: 8080, State: lbdv1.BackendState_BACKEND_STATE_ACTIVE},
				UpdateMask:     &fieldmaskpb.FieldMask{Paths: []string{"state"}},
				OnlyFromStates: []lbdv1.BackendState{lbdv1.BackendState_BACKEND_STATE_DRAINING}})
			return err
		}, codes.FailedPrecondition, "only_from_states"},
		{"backend delete missing", nil, func(c *clients) error {
			_, err := c.lb.DeleteBackend(bg(), &lbdv1.DeleteBackendRequest{ServiceName: "web", Address: "198.18.1.9", Port: 8080})
			return err
		}, codes.NotFound, "198.18.1.9:8080"},
		{"backend delete bad address", nil, func(c *clients) error {
			_, err := c.lb.DeleteBackend(bg(), &lbdv1.DeleteBackendRequest{ServiceName: "web", Address: "x", Port: 8080})
			return err
		}, codes.InvalidArgument, "address"},
		{"apply bad owner", nil, func(c *clients) error {
			_, err := c.lb.ApplyServices(bg(), &lbdv1.ApplyServicesRequest{Owner: "a b", Services: []*lbdv1.Service{web()}})
			return err
		}, codes.InvalidArgument, "owner"},
		{"apply other owner's name", nil, func(c *clients) error {
			_, err := c.lb.ApplyServices(bg(), &lbdv1.ApplyServicesRequest{Owner: "k8s-b", Services: []*lbdv1.Service{owned("k8s-a-svc", "203.0.113.50")}})
			return err
		}, codes.FailedPrecondition, "services[0].name"},
		{"apply other owner's frontend", nil, func(c *clients) error {
			_, err := c.lb.ApplyServices(bg(), &lbdv1.ApplyServicesRequest{Owner: "k8s-b", Services: []*lbdv1.Service{owned("b-svc", "203.0.113.50")}})
			return err
		}, codes.AlreadyExists, "services[0].vip"},
		{"apply operator's frontend", nil, func(c *clients) error {
			_, err := c.lb.ApplyServices(bg(), &lbdv1.ApplyServicesRequest{Owner: "k8s-b", Services: []*lbdv1.Service{owned("b-svc", "203.0.113.10")}})
			return err
		}, codes.AlreadyExists, "services[0].vip"},
		{"apply one bad of many", nil, func(c *clients) error {
			bad := owned("a-2", "203.0.113.52")
			bad.Backends[0].Port = 0
			_, err := c.lb.ApplyServices(bg(), &lbdv1.ApplyServicesRequest{Owner: "k8s-a", Services: []*lbdv1.Service{owned("a-1", "203.0.113.51"), bad}})
			return err
		}, codes.InvalidArgument, "services[1].backends[0].port"},
		{"apply duplicate names", nil, func(c *clients) error {
			_, err := c.lb.ApplyServices(bg(), &lbdv1.ApplyServicesRequest{Owner: "k8s-a", Services: []*lbdv1.Service{owned("a-1", "203.0.113.51"), owned("a-1", "203.0.113.52")}})
			return err
		}, codes.InvalidArgument, "services[1].name"},
		{"apply duplicate frontends", nil, func(c *clients) error {
			_, err := c.lb.ApplyServices(bg(), &lbdv1.ApplyServicesRequest{Owner: "k8s-a", Services: []*lbdv1.Service{owned("a-1", "203.0.113.51"), owned("a-2", "203.0.113.51")}})
			return err
		}, codes.InvalidArgument, "services[1].vip"},
		{"apply mismatched owner field", nil, func(c *clients) error {
			s := owned("a-1", "203.0.113.51")
			s.Owner = "k8s-b"
			_, err := c.lb.ApplyServices(bg(), &lbdv1.ApplyServicesRequest{Owner: "k8s-a", Services: []*lbdv1.Service{s}})
			return err
		}, codes.InvalidArgument, "services[0].owner"},
		{"apply over service limit", nil, func(c *clients) error {
			var svcs []*lbdv1.Service
			for i := range 60 {
				svcs = append(svcs, owned("many-"+itoa(i), "203.0.113."+itoa(100+i)))
			}
			_, err := c.lb.ApplyServices(bg(), &lbdv1.ApplyServicesRequest{Owner: "k8s-c", Services: svcs})
			return err
		}, codes.FailedPrecondition, "limit"},
		{"peer bad address", nil, createPeer(&lbdv1.BgpPeer{Address: "198.18.0", PeerAs: 65000}), codes.InvalidArgument, "peer.address"},
		{"peer AS 0", nil, createPeer(&lbdv1.BgpPeer{Address: "198.18.0.254", PeerAs: 0}), codes.InvalidArgument, "peer.peer_as"},
		{"peer duplicate", nil, createPeer(&lbdv1.BgpPeer{Address: "198.18.0.1", PeerAs: 65001}), codes.AlreadyExists, "peer.address"},
		{"peer hold too short", nil, createPeer(&lbdv1.BgpPeer{Address: "198.18.0.254", PeerAs: 65000, HoldTime: durationpb.New(time.Second)}), codes.InvalidArgument, "peer.hold_time"},
		{"peer keepalive ≥ hold", nil, createPeer(&lbdv1.BgpPeer{Address: "198.18.0.254", PeerAs: 65000,
			HoldTime: durationpb.New(9 * time.Second), KeepaliveInterval: durationpb.New(9 * time.Second)}), codes.InvalidArgument, "peer.keepalive_interval"},
		{"peer multihop", nil, createPeer(&lbdv1.BgpPeer{Address: "198.18.0.254", PeerAs: 65000, EbgpMultihopTtl: 300}), codes.InvalidArgument, "peer.ebgp_multihop_ttl"},
		{"peer gr time without gr", nil, createPeer(&lbdv1.BgpPeer{Address: "198.18.0.254", PeerAs: 65000, GracefulRestartTime: durationpb.New(time.Minute)}), codes.InvalidArgument, "peer.graceful_restart_time"},
		{"peer password too long", nil, createPeer(&lbdv1.BgpPeer{Address: "198.18.0.254", PeerAs: 65000, Password: strings.Repeat("x", 81)}), codes.InvalidArgument, "peer.password"},
		{"peer over limit", func(c *clients) error {
			for i := range 2 {
				if _, err := c.bgp.CreateBgpPeer(bg(), &lbdv1.CreateBgpPeerRequest{Peer: &lbdv1.BgpPeer{Address: "198.18.0." + itoa(10+i), PeerAs: 65000}}); err != nil {
					return err
				}
			}
			return nil
		}, createPeer(&lbdv1.BgpPeer{Address: "198.18.0.99", PeerAs: 65000}), codes.FailedPrecondition, "limit"},
		{"peer update missing", nil, func(c *clients) error {
			_, err := c.bgp.UpdateBgpPeer(bg(), &lbdv1.UpdateBgpPeerRequest{Peer: &lbdv1.BgpPeer{Address: "198.18.0.200", PeerAs: 65000}})
			return err
		}, codes.NotFound, "198.18.0.200"},
		{"peer delete missing", nil, func(c *clients) error {
			_, err := c.bgp.DeleteBgpPeer(bg(), &lbdv1.DeleteBgpPeerRequest{Address: "198.18.0.200"})
			return err
		}, codes.NotFound, "198.18.0.200"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := start(t)
			seed(t, c)
			if tc.prep != nil {
				if err := tc.prep(c); err != nil {
					t.Fatalf("prepare: %v", err)
				}
			}
			before := snapshot(t, c)
			err := tc.call(c)
			if status.Code(err) != tc.code {
				t.Fatalf("got %v, want code %v", err, tc.code)
			}
			if msg := status.Convert(err).Message(); !strings.Contains(msg, tc.field) {
				t.Errorf("message %q does not name %q", msg, tc.field)
			}
			if after := snapshot(t, c); !sameSnapshot(before, after) {
				t.Errorf("state changed by a rejected call:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}

func owned(name, vip string) *lbdv1.Service {
	return &lbdv1.Service{Name: name, Vip: vip, Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP,
		Backends: []*lbdv1.Backend{{Address: "198.18.4.1", Port: 80}}}
}

func createPeer(p *lbdv1.BgpPeer) func(*clients) error {
	return func(c *clients) error {
		_, err := c.bgp.CreateBgpPeer(bg(), &lbdv1.CreateBgpPeerRequest{Peer: p})
		return err
	}
}

// seed creates the state every bad-request case starts from.
func seed(t *testing.T, c *clients) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("seed: %v", err)
		}
	}
	_, err := c.lb.CreateService(ctx(t), &lbdv1.CreateServiceRequest{Service: web()})
	must(err)
	_, err = c.lb.CreateService(ctx(t), &lbdv1.CreateServiceRequest{Service: web6()})
	must(err)
	dns := &lbdv1.Service{Name: "dns", Vip: "203.0.113.20", Port: 53, Protocol: lbdv1.Protocol_PROTOCOL_UDP,
		Backends: []*lbdv1.Backend{{Address: "198.18.1.3", Port: 53}}}
	_, err = c.lb.CreateService(ctx(t), &lbdv1.CreateServiceRequest{Service: dns})
	must(err)
	_, err = c.lb.ApplyServices(ctx(t), &lbdv1.ApplyServicesRequest{Owner: "k8s-a", Services: []*lbdv1.Service{owned("k8s-a-svc", "203.0.113.50")}})
	must(err)
	_, err = c.bgp.CreateBgpPeer(ctx(t), &lbdv1.CreateBgpPeerRequest{Peer: &lbdv1.BgpPeer{Address: "198.18.0.1", PeerAs: 65000, Password: "secret"}})
	must(err)
}
