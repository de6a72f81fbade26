// Package authz decides who may call which RPC of lbd's API. An operator's policy file
// binds principals (a client certificate's identity on TCP, a uid or group on the Unix
// socket) to four roles; the policy is compiled into gRPC's own authorization engine
// (google.golang.org/grpc/authz) per transport, and an owner check on top limits writers
// to the services of the owners they are given.
package authz

import (
	"slices"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
)

// Access is what a method needs.
type Access int

// Accesses, each granted to some roles (roleAccess).
const (
	// Read: reading state, tracing, stats, health, reflection.
	Read Access = iota + 1
	// Operate: drain and undrain the node, verify it; watch clients' packets (the
	// datapath monitor); a backend's weight and state
	// (UpdateBackend naming only those fields) on any owner's service.
	Operate
	// Write: change services and backends, limited to a writer's owners.
	Write
	// Admin: BGP peers, detaching the datapath.
	Admin
)

func (a Access) String() string {
	switch a {
	case Read:
		return "read"
	case Operate:
		return "operate"
	case Write:
		return "write"
	case Admin:
		return "admin"
	}
	return "unknown"
}

// methods gives every RPC lbd serves the access it needs. A method missing here is
// denied to every role, root included: adding an RPC means deciding who may call it
// (daemon/lbd's TestEveryRPCByRoleAndTransport fails until then).
var methods = map[string]Access{
	lbdv1.LoadBalancerService_CreateService_FullMethodName:                 Write,
	lbdv1.LoadBalancerService_GetService_FullMethodName:                    Read,
	lbdv1.LoadBalancerService_ListServices_FullMethodName:                  Read,
	lbdv1.LoadBalancerService_UpdateService_FullMethodName:                 Write,
	lbdv1.LoadBalancerService_DeleteService_FullMethodName:                 Write,
	lbdv1.LoadBalancerService_ApplyServices_FullMethodName:                 Write,
	lbdv1.LoadBalancerService_WatchServices_FullMethodName:                 Read,
	lbdv1.LoadBalancerService_CreateBackend_FullMethodName:                 Write,
	lbdv1.LoadBalancerService_GetBackend_FullMethodName:                    Read,
	lbdv1.LoadBalancerService_ListBackends_FullMethodName:                  Read,
	lbdv1.LoadBalancerService_UpdateBackend_FullMethodName:                 Write, // and Operate, for weight and state
	lbdv1.LoadBalancerService_DeleteBackend_FullMethodName:                 Write,
	lbdv1.LoadBalancerService_TraceFlow_FullMethodName:                     Read,
	lbdv1.LoadBalancerService_ListConnections_FullMethodName:               Read,
	lbdv1.LoadBalancerService_GetStats_FullMethodName:                      Read,
	lbdv1.LoadBalancerService_ListSocketTranslations_FullMethodName:        Read,
	lbdv1.LoadBalancerService_MonitorDatapath_FullMethodName:               Operate, // clients' packets: not for readers
	lbdv1.BgpService_CreateBgpPeer_FullMethodName:                          Admin,
	lbdv1.BgpService_GetBgpPeer_FullMethodName:                             Read,
	lbdv1.BgpService_ListBgpPeers_FullMethodName:                           Read,
	lbdv1.BgpService_WatchBgpPeers_FullMethodName:                          Read,
	lbdv1.BgpService_UpdateBgpPeer_FullMethodName:                          Admin,
	lbdv1.BgpService_DeleteBgpPeer_FullMethodName:                          Admin,
	lbdv1.BgpService_ListBgpRoutes_FullMethodName:                          Read,
	lbdv1.NodeService_GetNode_FullMethodName:                               Read,
	lbdv1.NodeService_DrainNode_FullMethodName:                             Operate,
	lbdv1.NodeService_UndrainNode_FullMethodName:                           Operate,
	lbdv1.NodeService_DetachNode_FullMethodName:                            Admin,
	lbdv1.NodeService_VerifyNode_FullMethodName:                            Operate,
	lbdv1.FleetService_ListServiceDigests_FullMethodName:                   Read,
	lbdv1.FleetService_GetFleet_FullMethodName:                             Read,
	healthpb.Health_Check_FullMethodName:                                   Read,
	healthpb.Health_List_FullMethodName:                                    Read,
	healthpb.Health_Watch_FullMethodName:                                   Read,
	reflectionv1.ServerReflection_ServerReflectionInfo_FullMethodName:      Read,
	reflectionv1alpha.ServerReflection_ServerReflectionInfo_FullMethodName: Read,
}

// operatorBackendFields are the fields of a backend an operator may change on any
// service (UpdateBackend with an update mask naming only these).
var operatorBackendFields = []string{"weight", "state"}

// MethodAccess returns what method needs; false for a method without a rule.
func MethodAccess(method string) (Access, bool) {
	a, ok := methods[method]
	return a, ok
}

// Mutating reports whether method changes state (anything but Read).
func Mutating(method string) bool {
	a, ok := methods[method]
	return !ok || a != Read
}

// Roles a policy rule may name.
const (
	RoleReader   = "reader"
	RoleOperator = "operator"
	RoleWriter   = "writer"
	RoleAdmin    = "admin"
)

// Roles lists them, least power first.
var Roles = []string{RoleReader, RoleOperator, RoleWriter, RoleAdmin}

// roleAccess is what each role may do.
var roleAccess = map[string][]Access{
	RoleReader:   {Read},
	RoleOperator: {Read, Operate},
	RoleWriter:   {Read, Write},
	RoleAdmin:    {Read, Operate, Write, Admin},
}

// roleMethods returns the methods a role's rule allows in gRPC's engine: the methods of
// its accesses, and UpdateBackend for operators (the owner check then limits them to
// weight and state).
func roleMethods(role string) []string {
	var out []string
	for m, a := range methods {
		if slices.Contains(roleAccess[role], a) || (role == RoleOperator && m == lbdv1.LoadBalancerService_UpdateBackend_FullMethodName) {
			out = append(out, m)
		}
	}
	slices.Sort(out)
	return out
}
