package api

import (
	"context"

	"github.com/lbd-dev/lbd/daemon/fleet"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Tables is the datapath as the fleet RPCs see it: digests of what its maps hold per
// service (datapath.Manager.TableDigests). Nodes that program no service pass nil.
type Tables interface {
	TableDigests() (map[string]string, error)
}

// Fleet is the fleet store's view of the registered nodes; nil with the file store.
type Fleet interface {
	View(context.Context) (*lbdv1.GetFleetResponse, error)
}

// ListServiceDigests implements lbdv1.FleetServiceServer.
func (s *Server) ListServiceDigests(context.Context, *lbdv1.ListServiceDigestsRequest) (*lbdv1.ListServiceDigestsResponse, error) {
	if s.opts.Tables == nil {
		return nil, status.Error(codes.FailedPrecondition, "this node programs no services (only LB nodes and socket-level load balancing do): it has no digests")
	}
	tables, err := s.opts.Tables.TableDigests()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read the datapath: %v", err)
	}
	return &lbdv1.ListServiceDigestsResponse{Digests: fleet.Digests(s.st.ListServices(""), tables), Node: s.node()}, nil
}

// GetFleet implements lbdv1.FleetServiceServer.
func (s *Server) GetFleet(ctx context.Context, _ *lbdv1.GetFleetRequest) (*lbdv1.GetFleetResponse, error) {
	if s.opts.Fleet == nil {
		return nil, status.Error(codes.FailedPrecondition, "this node uses the file store, which has no fleet: compare nodes with lbctl fleet check -s NODE1 -s NODE2 ...")
	}
	return s.opts.Fleet.View(ctx)
}
