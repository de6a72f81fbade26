// Package api serves lbd's gRPC API (package lbd.v1) over the desired-state store.
package api

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/model"
	"github.com/lbd-dev/lbd/daemon/monitor"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Datapath is what the API asks of the node's datapath. A node without one (control
// plane only) passes nil and those RPCs answer Unimplemented.
type Datapath interface {
	TraceFlow(context.Context, model.Flow) (*lbdv1.TraceFlowResponse, error)
	ListConnections(context.Context, *lbdv1.ListConnectionsRequest) (*lbdv1.ListConnectionsResponse, error)
	GetStats(context.Context, *lbdv1.GetStatsRequest) (*lbdv1.GetStatsResponse, error)
	ListSocketTranslations(context.Context, *lbdv1.ListSocketTranslationsRequest) (*lbdv1.ListSocketTranslationsResponse, error)
	Detach(context.Context) error
	// Attached reports whether the programs are attached to every interface.
	Attached() bool
	// Ready reports whether the datapath forwards what it is asked to, and why not.
	Ready() (bool, string)
	// NextHops are the paths toward the backend nodes (LB role).
	NextHops() []*lbdv1.NextHop
	// Verify compares the datapath with the desired state and repairs it; DriftCounts
	// counts the repairs since start, by kind.
	Verify(context.Context) ([]*lbdv1.Drift, error)
	DriftCounts() map[string]uint64
}

// BGP is the node's BGP speaker as the API sees it; nil on nodes without one.
type BGP interface {
	// Peers returns every peer, from the configuration file and from the API, with its
	// session status, sorted by address.
	Peers(context.Context) ([]*lbdv1.BgpPeer, error)
	// Routes returns the routes the node advertises.
	Routes(context.Context) ([]*lbdv1.BgpRoute, error)
	// Static reports whether a peer address comes from the configuration file: the API
	// does not create, change or delete those.
	Static(addr netip.Addr) bool
}

// Options configure the API server.
type Options struct {
	Store    *store.Store
	Logger   hclog.Logger
	Roles    []string
	Version  string
	Datapath Datapath
	BGP      BGP
	// Tables and Fleet serve the fleet RPCs (fleet.go); nil where the node has none.
	Tables Tables
	Fleet  Fleet
	// Monitor serves MonitorDatapath; nil on a node without the LB role.
	Monitor *monitor.Hub
	// MaxWatchers bounds the WatchServices streams open at once (DefaultMaxWatchers if 0).
	MaxWatchers int
	// WatchBacklog is how many changes a watcher may lag behind before its stream is
	// ended with RESOURCE_EXHAUSTED (it then re-watches and gets a fresh snapshot);
	// DefaultWatchBacklog if 0.
	WatchBacklog int
}

// Server implements the lbd.v1 services.
type Server struct {
	lbdv1.UnimplementedLoadBalancerServiceServer
	lbdv1.UnimplementedBgpServiceServer
	lbdv1.UnimplementedNodeServiceServer
	lbdv1.UnimplementedFleetServiceServer

	opts     Options
	st       *store.Store
	log      hclog.Logger
	start    time.Time
	stopping chan struct{}
	stopOnce sync.Once
	watchers counter
}

// New returns a server; Register attaches it to a grpc.Server.
func New(opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if opts.MaxWatchers <= 0 {
		opts.MaxWatchers = DefaultMaxWatchers
	}
	if opts.WatchBacklog <= 0 {
		opts.WatchBacklog = DefaultWatchBacklog
	}
	return &Server{opts: opts, st: opts.Store, log: opts.Logger, start: time.Now(), stopping: make(chan struct{}),
		watchers: counter{limit: opts.MaxWatchers}}
}

// Shutdown ends every open stream (watches, reflection) so that a graceful stop of the
// gRPC server does not wait for clients that never hang up. Unary calls still finish.
func (s *Server) Shutdown() { s.stopOnce.Do(func() { close(s.stopping) }) }

// StreamInterceptor cancels a stream's context when Shutdown is called, and states the
// staleness of what the node serves as the stream starts (StaleHeader). Install it on
// every grpc.Server the API is registered on.
func (s *Server) StreamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if r := s.staleHeader(); r != "" {
		_ = ss.SetHeader(metadata.Pairs(StaleHeader, r))
	}
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	go func() {
		select {
		case <-s.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	return handler(srv, &stream{ServerStream: ss, ctx: ctx})
}

type stream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *stream) Context() context.Context { return s.ctx }

// Register adds the server's services to g.
func (s *Server) Register(g *grpc.Server) {
	lbdv1.RegisterLoadBalancerServiceServer(g, s)
	lbdv1.RegisterBgpServiceServer(g, s)
	lbdv1.RegisterNodeServiceServer(g, s)
	lbdv1.RegisterFleetServiceServer(g, s)
}

// ownerCheckKey is the context key of a call's owner check (WithOwnerCheck).
type ownerCheckKey struct{}

// WithOwnerCheck returns ctx for a call whose changes must each pass check: the store
// calls it inside the change, on every service the change touches, so that the
// authorization's owner rule and the write are one step. A nil check limits nothing.
func WithOwnerCheck(ctx context.Context, check store.OwnerCheck) context.Context {
	return context.WithValue(ctx, ownerCheckKey{}, check)
}

// writer is the store as the caller of ctx may change it.
func (s *Server) writer(ctx context.Context) store.Writer {
	check, _ := ctx.Value(ownerCheckKey{}).(store.OwnerCheck)
	return s.st.As(check)
}

// unimplemented answers an RPC whose machinery is not on this node.
func unimplemented(what string) error {
	return status.Errorf(codes.Unimplemented, "%s needs the node's datapath, and this lbd runs without one (start it with --role lb, backend or both)", what)
}

// CreateService implements lbdv1.LoadBalancerServiceServer.
func (s *Server) CreateService(ctx context.Context, r *lbdv1.CreateServiceRequest) (*lbdv1.CreateServiceResponse, error) {
	svc, err := s.writer(ctx).CreateService(r.GetService())
	if err != nil {
		return nil, err
	}
	s.log.Info("service created", "op", "create-service", "service", svc.Name, "frontend", frontend(svc), "backends", len(svc.Backends))
	return &lbdv1.CreateServiceResponse{Service: svc}, nil
}

// GetService implements lbdv1.LoadBalancerServiceServer.
func (s *Server) GetService(_ context.Context, r *lbdv1.GetServiceRequest) (*lbdv1.GetServiceResponse, error) {
	svc, err := s.st.GetService(r.GetName())
	if err != nil {
		return nil, err
	}
	return &lbdv1.GetServiceResponse{Service: svc}, nil
}

// UpdateService implements lbdv1.LoadBalancerServiceServer.
func (s *Server) UpdateService(ctx context.Context, r *lbdv1.UpdateServiceRequest) (*lbdv1.UpdateServiceResponse, error) {
	svc, err := s.writer(ctx).UpdateService(r.GetService(), r.GetExpectedRevision())
	if err != nil {
		return nil, err
	}
	s.log.Info("service updated", "op", "update-service", "service", svc.Name, "revision", svc.Revision)
	return &lbdv1.UpdateServiceResponse{Service: svc}, nil
}

// DeleteService implements lbdv1.LoadBalancerServiceServer.
func (s *Server) DeleteService(ctx context.Context, r *lbdv1.DeleteServiceRequest) (*lbdv1.DeleteServiceResponse, error) {
	if err := s.writer(ctx).DeleteService(r.GetName()); err != nil {
		return nil, err
	}
	s.log.Info("service deleted", "op", "delete-service", "service", r.GetName())
	return &lbdv1.DeleteServiceResponse{}, nil
}

// ApplyServices implements lbdv1.LoadBalancerServiceServer.
func (s *Server) ApplyServices(ctx context.Context, r *lbdv1.ApplyServicesRequest) (*lbdv1.ApplyServicesResponse, error) {
	w := s.writer(ctx)
	apply := w.ApplyServices
	if r.GetValidateOnly() {
		apply = w.PlanServices
	}
	res, err := apply(r.GetOwner(), r.GetServices())
	if err != nil {
		return nil, err
	}
	if !r.GetValidateOnly() {
		s.log.Info("services applied", "op", "apply-services", "owner", r.GetOwner(), "created", res.Created, "updated", res.Updated, "deleted", res.Deleted, "unchanged", res.Unchanged)
	}
	return &lbdv1.ApplyServicesResponse{
		Created: uint32(res.Created), Updated: uint32(res.Updated),
		Deleted: uint32(res.Deleted), Unchanged: uint32(res.Unchanged),
		Changes: res.Changes,
	}, nil
}

// CreateBackend implements lbdv1.LoadBalancerServiceServer.
func (s *Server) CreateBackend(ctx context.Context, r *lbdv1.CreateBackendRequest) (*lbdv1.CreateBackendResponse, error) {
	b, err := s.writer(ctx).CreateBackend(r.GetServiceName(), r.GetBackend())
	if err != nil {
		return nil, err
	}
	s.log.Info("backend added", "op", "create-backend", "service", r.GetServiceName(), "backend", b.Address, "port", b.Port)
	return &lbdv1.CreateBackendResponse{Backend: b}, nil
}

// GetBackend implements lbdv1.LoadBalancerServiceServer.
func (s *Server) GetBackend(_ context.Context, r *lbdv1.GetBackendRequest) (*lbdv1.GetBackendResponse, error) {
	b, err := s.st.GetBackend(r.GetServiceName(), r.GetAddress(), r.GetPort())
	if err != nil {
		return nil, err
	}
	return &lbdv1.GetBackendResponse{Backend: b}, nil
}

// ListBackends implements lbdv1.LoadBalancerServiceServer.
func (s *Server) ListBackends(_ context.Context, r *lbdv1.ListBackendsRequest) (*lbdv1.ListBackendsResponse, error) {
	svc, err := s.st.GetService(r.GetServiceName())
	if err != nil {
		return nil, err
	}
	return &lbdv1.ListBackendsResponse{Backends: svc.Backends}, nil
}

// UpdateBackend implements lbdv1.LoadBalancerServiceServer.
func (s *Server) UpdateBackend(ctx context.Context, r *lbdv1.UpdateBackendRequest) (*lbdv1.UpdateBackendResponse, error) {
	b, err := s.writer(ctx).UpdateBackendFields(r.GetServiceName(), r.GetBackend(), store.BackendUpdate{
		Fields: r.GetUpdateMask().GetPaths(), FromStates: r.GetOnlyFromStates(),
	})
	if err != nil {
		return nil, err
	}
	s.log.Info("backend updated", "op", "update-backend", "service", r.GetServiceName(), "backend", b.Address, "port", b.Port, "state", b.State.String(), "weight", b.Weight)
	return &lbdv1.UpdateBackendResponse{Backend: b}, nil
}

// DeleteBackend implements lbdv1.LoadBalancerServiceServer.
func (s *Server) DeleteBackend(ctx context.Context, r *lbdv1.DeleteBackendRequest) (*lbdv1.DeleteBackendResponse, error) {
	if err := s.writer(ctx).DeleteBackend(r.GetServiceName(), r.GetAddress(), r.GetPort()); err != nil {
		return nil, err
	}
	s.log.Info("backend removed", "op", "delete-backend", "service", r.GetServiceName(), "backend", r.GetAddress(), "port", r.GetPort())
	return &lbdv1.DeleteBackendResponse{}, nil
}

// TraceFlow implements lbdv1.LoadBalancerServiceServer.
func (s *Server) TraceFlow(ctx context.Context, r *lbdv1.TraceFlowRequest) (*lbdv1.TraceFlowResponse, error) {
	if s.opts.Datapath == nil {
		return nil, unimplemented("TraceFlow")
	}
	src, err1 := netip.ParseAddr(r.SourceAddress)
	dst, err2 := netip.ParseAddr(r.DestinationAddress)
	if err1 != nil || err2 != nil || src.Is4() != dst.Is4() || r.SourcePort > 65535 || r.DestinationPort > 65535 {
		return nil, status.Error(codes.InvalidArgument, "trace: need source and destination addresses of one family and ports 0-65535")
	}
	return s.opts.Datapath.TraceFlow(ctx, model.Flow{
		Src: netip.AddrPortFrom(src, uint16(r.SourcePort)), Dst: netip.AddrPortFrom(dst, uint16(r.DestinationPort)),
		Protocol: r.Protocol, QUICDestinationConnectionID: r.QuicDestinationConnectionId,
	})
}

// ListConnections implements lbdv1.LoadBalancerServiceServer.
func (s *Server) ListConnections(ctx context.Context, r *lbdv1.ListConnectionsRequest) (*lbdv1.ListConnectionsResponse, error) {
	if s.opts.Datapath == nil {
		return nil, unimplemented("ListConnections")
	}
	return s.opts.Datapath.ListConnections(ctx, r)
}

// ListSocketTranslations implements lbdv1.LoadBalancerServiceServer.
func (s *Server) ListSocketTranslations(ctx context.Context, r *lbdv1.ListSocketTranslationsRequest) (*lbdv1.ListSocketTranslationsResponse, error) {
	if s.opts.Datapath == nil {
		return nil, unimplemented("ListSocketTranslations")
	}
	if r.Vip != "" {
		if _, err := netip.ParseAddr(r.Vip); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "vip: %q is not an IP address", r.Vip)
		}
	}
	if r.BackendAddress != "" {
		if _, err := netip.ParseAddr(r.BackendAddress); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "backend_address: %q is not an IP address", r.BackendAddress)
		}
	}
	return s.opts.Datapath.ListSocketTranslations(ctx, r)
}

// GetStats implements lbdv1.LoadBalancerServiceServer.
func (s *Server) GetStats(ctx context.Context, r *lbdv1.GetStatsRequest) (*lbdv1.GetStatsResponse, error) {
	if s.opts.Datapath == nil {
		return nil, unimplemented("GetStats")
	}
	return s.opts.Datapath.GetStats(ctx, r)
}

func frontend(svc *lbdv1.Service) string {
	return fmt.Sprintf("%s port %d %s", svc.Vip, svc.Port, svc.Protocol)
}
