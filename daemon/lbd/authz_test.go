package lbd_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

// The roles of the table. "adapter" is a writer limited to k8s/* (the Kubernetes
// adapter), "writer" one limited to team-a, the owner of every service the table's
// requests touch; "nobody" has a certificate or user the policy does not name.
var tableRoles = []string{"reader", "operator", "writer", "adapter", "admin", "nobody"}

// allowedRoles says, independently of the daemon's own table, which roles may call each
// RPC with the table's request (which touches team-a's service "team-web"). An RPC lbd
// serves that is missing here fails the test.
var allowedRoles = func() map[string][]string {
	read := []string{"reader", "operator", "writer", "adapter", "admin"}
	write := []string{"writer", "admin"}
	operate := []string{"operator", "admin"}
	admin := []string{"admin"}
	m := map[string][]string{}
	for _, rpc := range []string{"GetService", "ListServices", "WatchServices", "GetBackend", "ListBackends", "TraceFlow",
		"ListConnections", "GetStats", "ListSocketTranslations"} {
		m["/lbd.v1.LoadBalancerService/"+rpc] = read
	}
	for _, rpc := range []string{"CreateService", "UpdateService", "DeleteService", "ApplyServices", "CreateBackend", "DeleteBackend"} {
		m["/lbd.v1.LoadBalancerService/"+rpc] = write
	}
	// The table's UpdateBackend names only the weight: operators may.
	m["/lbd.v1.LoadBalancerService/UpdateBackend"] = []string{"operator", "writer", "admin"}
	for _, rpc := range []string{"GetBgpPeer", "ListBgpPeers", "WatchBgpPeers", "ListBgpRoutes"} {
		m["/lbd.v1.BgpService/"+rpc] = read
	}
	for _, rpc := range []string{"CreateBgpPeer", "UpdateBgpPeer", "DeleteBgpPeer"} {
		m["/lbd.v1.BgpService/"+rpc] = admin
	}
	m["/lbd.v1.NodeService/GetNode"] = read
	m["/lbd.v1.NodeService/DrainNode"] = operate
	m["/lbd.v1.NodeService/UndrainNode"] = operate
	m["/lbd.v1.NodeService/VerifyNode"] = operate
	// The monitor shows clients' packets.
	m["/lbd.v1.LoadBalancerService/MonitorDatapath"] = operate
	m["/lbd.v1.NodeService/DetachNode"] = admin
	m["/lbd.v1.FleetService/ListServiceDigests"] = read
	m["/lbd.v1.FleetService/GetFleet"] = read
	for _, rpc := range []string{"Check", "Watch", "List"} {
		m["/grpc.health.v1.Health/"+rpc] = read
	}
	m["/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"] = read
	m["/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"] = read
	return m
}()

// teamWeb is the service the table's requests touch.
func teamWeb() *lbdv1.Service {
	return &lbdv1.Service{Name: "team-web", Owner: "team-a", Vip: "203.0.113.10", Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP,
		Backends: []*lbdv1.Backend{{Address: "198.18.1.10", Port: 8080, NodeAddress: "198.18.1.1", Weight: 1}}}
}

// tableRequests are the requests the table sends; an RPC without one gets its empty
// request.
func tableRequests() map[string]proto.Message {
	be := &lbdv1.Backend{Address: "198.18.1.10", Port: 8080, NodeAddress: "198.18.1.1", Weight: 2}
	return map[string]proto.Message{
		"/lbd.v1.LoadBalancerService/CreateService": &lbdv1.CreateServiceRequest{Service: &lbdv1.Service{Name: "team-new", Owner: "team-a",
			Vip: "203.0.113.11", Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP}},
		"/lbd.v1.LoadBalancerService/GetService":    &lbdv1.GetServiceRequest{Name: "team-web"},
		"/lbd.v1.LoadBalancerService/UpdateService": &lbdv1.UpdateServiceRequest{Service: func() *lbdv1.Service { s := teamWeb(); s.Port = 81; return s }()},
		"/lbd.v1.LoadBalancerService/DeleteService": &lbdv1.DeleteServiceRequest{Name: "team-web"},
		"/lbd.v1.LoadBalancerService/ApplyServices": &lbdv1.ApplyServicesRequest{Owner: "team-a"},
		"/lbd.v1.LoadBalancerService/CreateBackend": &lbdv1.CreateBackendRequest{ServiceName: "team-web",
			Backend: &lbdv1.Backend{Address: "198.18.1.11", Port: 8080, NodeAddress: "198.18.1.1", Weight: 1}},
		"/lbd.v1.LoadBalancerService/GetBackend":   &lbdv1.GetBackendRequest{ServiceName: "team-web", Address: "198.18.1.10", Port: 8080},
		"/lbd.v1.LoadBalancerService/ListBackends": &lbdv1.ListBackendsRequest{ServiceName: "team-web"},
		"/lbd.v1.LoadBalancerService/UpdateBackend": &lbdv1.UpdateBackendRequest{ServiceName: "team-web", Backend: be,
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"weight"}}},
		"/lbd.v1.LoadBalancerService/DeleteBackend": &lbdv1.DeleteBackendRequest{ServiceName: "team-web", Address: "198.18.1.10", Port: 8080},
		"/lbd.v1.BgpService/CreateBgpPeer":          &lbdv1.CreateBgpPeerRequest{Peer: &lbdv1.BgpPeer{Address: "198.18.0.254", PeerAs: 65001}},
		"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": &reflectionpb.ServerReflectionRequest{
			MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{ListServices: "*"}},
	}
}

// authzEnv is an lbd serving a policy with every role on both transports.
type authzEnv struct {
	in        instance
	p         *proc
	admin     *grpc.ClientConn // root on the socket
	addr      string
	roots     *x509.CertPool
	certs     map[string]tls.Certificate
	users     map[string]osUser // empty when not root
	policy    string
	auditFile string
	sockGroup string
}

const adapterURI = "spiffe://lbd.test/k8s-adapter"

// writePolicy writes the table's policy; extra is appended to its rules.
func (e *authzEnv) writePolicy(t *testing.T, extra string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("rules:\n")
	unix := func(key, v string) {
		if len(e.users) > 0 {
			fmt.Fprintf(&b, "    %s: [%q]\n", key, v)
		}
	}
	b.WriteString("  - role: reader\n    principals: [\"spiffe://lbd.test/reader\"]\n")
	unix("unix_users", e.users["reader"].name)
	// The operator's certificate has no SAN: its subject is its identity. On the
	// socket it is an operator through a supplementary group.
	b.WriteString("  - role: operator\n    principals: [\"CN=oncall,O=sre\"]\n")
	unix("unix_groups", e.sockGroup+"o")
	b.WriteString("  - role: writer\n    owners: [team-a]\n    principals: [\"spiffe://lbd.test/team-a\"]\n")
	unix("unix_users", fmt.Sprint(e.users["writer"].uid))
	b.WriteString("  - role: writer\n    owners: [\"k8s/*\"]\n    principals: [\"" + adapterURI + "\"]\n")
	unix("unix_users", e.users["adapter"].name)
	b.WriteString("  - role: admin\n    principals: [\"spiffe://lbd.test/admin\"]\n")
	b.WriteString(extra)
	tmp := e.policy + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		t.Fatalf("write policy: %v", err)
	}
	if err := os.Rename(tmp, e.policy); err != nil {
		t.Fatalf("write policy: %v", err)
	}
}

// startAuthzEnv starts lbd with the table's policy, a group-accessible socket and an
// audit file, with users for the socket when the test runs as root.
func startAuthzEnv(t *testing.T, extraConfig string) *authzEnv {
	t.Helper()
	f := newTLSFixture(t)
	e := &authzEnv{in: newInstance(t), addr: freePort(t), roots: x509.NewCertPool(), certs: map[string]tls.Certificate{},
		users: map[string]osUser{}}
	e.roots.AddCert(f.ca.Cert)
	for role, uri := range map[string]string{"reader": "spiffe://lbd.test/reader", "writer": "spiffe://lbd.test/team-a",
		"adapter": adapterURI, "admin": "spiffe://lbd.test/admin", "nobody": "spiffe://lbd.test/nobody"} {
		e.certs[role] = principalCert(t, f.ca, uri, pkix.Name{CommonName: role})
	}
	e.certs["operator"] = principalCert(t, f.ca, "", pkix.Name{CommonName: "oncall", Organization: []string{"sre"}})
	dir := filepath.Dir(e.in.socket)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatalf("open socket directory: %v", err)
	}
	sockMode := "0600"
	if os.Geteuid() == 0 {
		e.sockGroup = "lbdt" + randomSuffix(t)
		addGroup(t, e.sockGroup)
		addGroup(t, e.sockGroup+"o")
		for _, role := range []string{"reader", "operator", "writer", "adapter", "nobody"} {
			var supp []string
			if role == "operator" {
				supp = []string{e.sockGroup + "o"}
			}
			e.users[role] = addUser(t, e.sockGroup+role[:3], e.sockGroup, supp...)
		}
		sockMode = "0660"
	}
	e.policy = filepath.Join(dir, "policy.yaml")
	e.auditFile = filepath.Join(dir, "audit.log")
	e.writePolicy(t, "")
	cfg := fmt.Sprintf("api:\n  socket_mode: %q\n  socket_group: %q\n  policy_file: %s\n  audit:\n    file: %s\n%s",
		sockMode, e.sockGroup, e.policy, e.auditFile, extraConfig)
	cfgPath := writeFile(t, dir, "lbd.yaml", []byte(cfg))
	e.p, e.admin = startLBD(t, e.in, append(f.args(e.addr), "--config", cfgPath, "--metrics-listen", "")...)
	return e
}

// conn returns a client connection of role over transport ("unix" or "tcp").
func (e *authzEnv) conn(t *testing.T, role, transport string) *grpc.ClientConn {
	t.Helper()
	var conn *grpc.ClientConn
	var err error
	switch {
	case transport == "tcp":
		conn, err = grpc.NewClient(e.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			RootCAs: e.roots, ServerName: "127.0.0.1", Certificates: []tls.Certificate{e.certs[role]}})))
	case role == "admin":
		return e.admin
	default:
		u := e.users[role]
		conn, err = grpc.NewClient("passthrough:///lbd", grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return dialAs(t, e.in.socket, u) }))
	}
	if err != nil {
		t.Fatalf("client of %s over %s: %v", role, transport, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// reset puts the state the table's requests expect back: team-web as created, nothing
// else of team-a's, the node not drained, no BGP peer.
func (e *authzEnv) reset(t *testing.T) {
	t.Helper()
	ctx := ctxT(t)
	lb := lbdv1.NewLoadBalancerServiceClient(e.admin)
	if _, err := lb.ApplyServices(ctx, &lbdv1.ApplyServicesRequest{Owner: "team-a", Services: []*lbdv1.Service{teamWeb()}}); err != nil {
		t.Fatalf("reset services: %v", err)
	}
	if _, err := lbdv1.NewNodeServiceClient(e.admin).UndrainNode(ctx, &lbdv1.UndrainNodeRequest{}); err != nil {
		t.Fatalf("reset node: %v", err)
	}
}

// state is everything a call could change, without output-only status.
func (e *authzEnv) state(t *testing.T) string {
	t.Helper()
	ctx := ctxT(t)
	svcs, err := lbdv1.NewLoadBalancerServiceClient(e.admin).ListServices(ctx, &lbdv1.ListServicesRequest{})
	if err != nil {
		t.Fatalf("list services: %v", err)
	}
	node, err := lbdv1.NewNodeServiceClient(e.admin).GetNode(ctx, &lbdv1.GetNodeRequest{})
	if err != nil {
		t.Fatalf("get node: %v", err)
	}
	peers, err := lbdv1.NewBgpServiceClient(e.admin).ListBgpPeers(ctx, &lbdv1.ListBgpPeersRequest{})
	if err != nil && status.Code(err) != codes.Unimplemented {
		t.Fatalf("list peers: %v", err)
	}
	var b strings.Builder
	for _, s := range svcs.GetServices() {
		s.Status = nil
		for _, be := range s.Backends {
			be.Health = nil
		}
		fmt.Fprintf(&b, "%v\n", s)
	}
	fmt.Fprintf(&b, "drained=%v peers=%v", node.GetNode().GetDrained(), peers.GetPeers())
	return b.String()
}

// rpc is one method lbd serves, from its descriptor.
type rpc struct {
	name         string // "/pkg.Service/Method"
	desc         protoreflect.MethodDescriptor
	serverStream bool
	clientStream bool
}

// servedRPCs lists every method lbd serves: the services its reflection names, their
// methods from the descriptors.
func servedRPCs(t *testing.T, admin *grpc.ClientConn) []rpc {
	t.Helper()
	stream, err := reflectionpb.NewServerReflectionClient(admin).ServerReflectionInfo(ctxT(t))
	if err != nil {
		t.Fatalf("reflection: %v", err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{ListServices: "*"}}); err != nil {
		t.Fatalf("reflection: %v", err)
	}
	res, err := stream.Recv()
	if err != nil {
		t.Fatalf("reflection: %v", err)
	}
	stream.CloseSend()
	var out []rpc
	for _, s := range res.GetListServicesResponse().GetService() {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(s.GetName()))
		if err != nil {
			t.Fatalf("descriptor of served service %s: %v", s.GetName(), err)
		}
		sd := d.(protoreflect.ServiceDescriptor)
		for i := range sd.Methods().Len() {
			md := sd.Methods().Get(i)
			out = append(out, rpc{name: fmt.Sprintf("/%s/%s", sd.FullName(), md.Name()), desc: md,
				serverStream: md.IsStreamingServer(), clientStream: md.IsStreamingClient()})
		}
	}
	if len(out) < 30 {
		t.Fatalf("reflection listed %d methods; the API has more than 30", len(out))
	}
	return out
}

// call makes one call of r with req and returns its error (nil: answered OK).
func call(t *testing.T, conn *grpc.ClientConn, r rpc, req proto.Message) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mt, err := protoregistry.GlobalTypes.FindMessageByName(r.desc.Output().FullName())
	if err != nil {
		t.Fatalf("type %s: %v", r.desc.Output().FullName(), err)
	}
	resp := mt.New().Interface()
	if !r.serverStream && !r.clientStream {
		return conn.Invoke(ctx, r.name, req, resp)
	}
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: r.serverStream, ClientStreams: r.clientStream}, r.name)
	if err != nil {
		return err
	}
	if err := s.SendMsg(req); err != nil {
		return s.RecvMsg(resp)
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	return s.RecvMsg(resp)
}

// auditLine is what the tests read from the audit file.
type auditLine struct {
	Principal, Transport, Method, Owner, Code, Message, Policy string
	Services                                                   []string
}

func readAudit(t *testing.T, path string) []auditLine {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("open audit file: %v", err)
	}
	defer f.Close()
	var out []auditLine
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l auditLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("audit line %q is not JSON: %v", sc.Text(), err)
		}
		out = append(out, l)
	}
	return out
}

// principalOf is the principal the audit trail names for role over transport.
func (e *authzEnv) principalOf(role, transport string) string {
	if transport == "tcp" {
		if role == "operator" {
			return "CN=oncall,O=sre"
		}
		return map[string]string{"reader": "spiffe://lbd.test/reader", "writer": "spiffe://lbd.test/team-a",
			"adapter": adapterURI, "admin": "spiffe://lbd.test/admin", "nobody": "spiffe://lbd.test/nobody"}[role]
	}
	if role == "admin" {
		return "unix:uid:0"
	}
	return fmt.Sprintf("unix:uid:%d", e.users[role].uid)
}

// TestEveryRPCByRoleAndTransport calls every RPC lbd serves, as each role, over the
// socket and over mutual TLS: a call the role may make is answered (whatever the
// answer), any other is PERMISSION_DENIED and leaves the state as it was. Every
// changing or refused call must then be in the audit trail with its principal and code.
func TestEveryRPCByRoleAndTransport(t *testing.T) {
	e := startAuthzEnv(t, "  rate_limit:\n    rate: 0\n")
	transports := []string{"tcp", "unix"}
	if len(e.users) == 0 {
		t.Log("not root: the Unix socket's roles need users created for the test; only TCP is tested")
		transports = []string{"tcp"}
	}
	rpcs := servedRPCs(t, e.admin)
	reqs := tableRequests()
	type made struct{ principal, method, code string }
	var audited []made
	for _, r := range rpcs {
		allowed, ok := allowedRoles[r.name]
		if !ok {
			t.Errorf("%s: lbd serves it, and this test does not say who may call it (add it to allowedRoles, and a rule in daemon/authz)", r.name)
			continue
		}
		req := reqs[r.name]
		if req == nil {
			mt, err := protoregistry.GlobalTypes.FindMessageByName(r.desc.Input().FullName())
			if err != nil {
				t.Fatalf("type %s: %v", r.desc.Input().FullName(), err)
			}
			req = mt.New().Interface()
		}
		mutating := !slices.Equal(allowed, allowedRoles["/lbd.v1.NodeService/GetNode"])
		for _, tr := range transports {
			for _, role := range tableRoles {
				if mutating {
					e.reset(t)
				}
				before := e.state(t)
				err := call(t, e.conn(t, role, tr), r, req)
				code := status.Code(err)
				want := slices.Contains(allowed, role)
				switch {
				case want && (code == codes.PermissionDenied || code == codes.Unauthenticated):
					t.Errorf("%s as %s over %s: %v, want it allowed", r.name, role, tr, err)
				case !want && code != codes.PermissionDenied:
					t.Errorf("%s as %s over %s: %v, want PERMISSION_DENIED", r.name, role, tr, err)
				case !want:
					if after := e.state(t); after != before {
						t.Errorf("%s as %s over %s was denied but changed the state:\nbefore %s\nafter  %s", r.name, role, tr, before, after)
					}
					if !strings.Contains(status.Convert(err).Message(), "see docs/security.md") {
						t.Errorf("%s as %s over %s: denied without saying where to look: %v", r.name, role, tr, err)
					}
				}
				if mutating || code == codes.PermissionDenied {
					audited = append(audited, made{e.principalOf(role, tr), strings.TrimPrefix(r.name, "/"), code.String()})
				}
			}
		}
	}
	lines := readAudit(t, e.auditFile)
	for _, m := range audited {
		i := slices.IndexFunc(lines, func(l auditLine) bool {
			return l.Principal == m.principal && l.Method == m.method && l.Code == m.code
		})
		if i < 0 {
			t.Errorf("audit trail lacks %s by %s answered %s", m.method, m.principal, m.code)
			continue
		}
		lines = slices.Delete(lines, i, i+1)
	}
	t.Logf("%d calls checked in the audit trail", len(audited))
}
