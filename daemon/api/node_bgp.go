package api

import (
	"context"
	"net/netip"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func (s *Server) node() *lbdv1.Node {
	svcs, bes := s.st.Counts()
	n := &lbdv1.Node{
		Roles:     s.opts.Roles,
		Version:   s.opts.Version,
		Drained:   s.st.Drained(),
		Services:  uint32(svcs),
		Backends:  uint32(bes),
		StartTime: timestamppb.New(s.start),
	}
	n.Ready, n.ReadyReason = true, "no datapath: this lbd runs the control plane only"
	if dp := s.opts.Datapath; dp != nil {
		n.Ready, n.ReadyReason = dp.Ready()
		n.DatapathAttached = dp.Attached()
		n.NextHops = dp.NextHops()
		n.DriftRepaired = dp.DriftCounts()
	}
	return n
}

// GetNode implements lbdv1.NodeServiceServer.
func (s *Server) GetNode(context.Context, *lbdv1.GetNodeRequest) (*lbdv1.GetNodeResponse, error) {
	return &lbdv1.GetNodeResponse{Node: s.node()}, nil
}

// DrainNode implements lbdv1.NodeServiceServer.
func (s *Server) DrainNode(context.Context, *lbdv1.DrainNodeRequest) (*lbdv1.DrainNodeResponse, error) {
	if err := s.st.SetDrained(true); err != nil {
		return nil, err
	}
	s.log.Info("node drained", "op", "drain-node")
	return &lbdv1.DrainNodeResponse{Node: s.node()}, nil
}

// UndrainNode implements lbdv1.NodeServiceServer.
func (s *Server) UndrainNode(context.Context, *lbdv1.UndrainNodeRequest) (*lbdv1.UndrainNodeResponse, error) {
	if err := s.st.SetDrained(false); err != nil {
		return nil, err
	}
	s.log.Info("node undrained", "op", "undrain-node")
	return &lbdv1.UndrainNodeResponse{Node: s.node()}, nil
}

// DetachNode implements lbdv1.NodeServiceServer.
func (s *Server) DetachNode(ctx context.Context, _ *lbdv1.DetachNodeRequest) (*lbdv1.DetachNodeResponse, error) {
	if s.opts.Datapath == nil {
		return nil, unimplemented("DetachNode")
	}
	if err := s.opts.Datapath.Detach(ctx); err != nil {
		return nil, datapathError("detach datapath", err)
	}
	s.log.Info("datapath detached", "op", "detach-node")
	return &lbdv1.DetachNodeResponse{Node: s.node()}, nil
}

// VerifyNode implements lbdv1.NodeServiceServer.
func (s *Server) VerifyNode(ctx context.Context, _ *lbdv1.VerifyNodeRequest) (*lbdv1.VerifyNodeResponse, error) {
	if s.opts.Datapath == nil {
		return nil, unimplemented("VerifyNode")
	}
	drift, err := s.opts.Datapath.Verify(ctx)
	if err != nil {
		return nil, datapathError("verify datapath", err)
	}
	s.log.Info("datapath verified", "op", "verify-node", "repaired", len(drift))
	return &lbdv1.VerifyNodeResponse{Repaired: drift, Node: s.node()}, nil
}

// datapathError is INTERNAL, unless the datapath cannot answer yet (UNAVAILABLE: lbd is
// still opening it), which the client may retry.
func datapathError(what string, err error) error {
	if status.Code(err) == codes.Unavailable {
		return err
	}
	return status.Errorf(codes.Internal, "%s: %v", what, err)
}

// noSpeaker is the status of every peer while the node runs no BGP speaker.
const noSpeaker = "configured; this lbd runs no BGP speaker (no bgp section in its configuration), so no session is attempted"

func withPeerStatus(p *lbdv1.BgpPeer) *lbdv1.BgpPeer {
	p.Status = &lbdv1.BgpPeerStatus{State: lbdv1.BgpSessionState_BGP_SESSION_STATE_IDLE, Reason: noSpeaker}
	return p
}

// peerStatus returns p with its live status, or p as stored if the speaker does not
// know it yet.
func (s *Server) peerStatus(ctx context.Context, p *lbdv1.BgpPeer) *lbdv1.BgpPeer {
	if s.opts.BGP == nil {
		return withPeerStatus(p)
	}
	peers, err := s.opts.BGP.Peers(ctx)
	if err == nil {
		for _, q := range peers {
			if q.Address == p.Address {
				return q
			}
		}
	}
	p.Status = &lbdv1.BgpPeerStatus{State: lbdv1.BgpSessionState_BGP_SESSION_STATE_IDLE, Reason: "being configured"}
	return p
}

// static reports whether addr, a request's peer address, is a peer of the
// configuration file. An address that does not parse is none: the store's validation
// says what is wrong with it.
func (s *Server) static(addr string) bool {
	if s.opts.BGP == nil {
		return false
	}
	a, err := netip.ParseAddr(addr)
	return err == nil && s.opts.BGP.Static(a)
}

func (s *Server) checkNotStatic(addr string) error {
	if s.static(addr) {
		return status.Errorf(codes.FailedPrecondition, "peer.address: %s is configured in lbd's configuration file; change it there", addr)
	}
	return nil
}

// CreateBgpPeer implements lbdv1.BgpServiceServer.
func (s *Server) CreateBgpPeer(ctx context.Context, r *lbdv1.CreateBgpPeerRequest) (*lbdv1.CreateBgpPeerResponse, error) {
	if s.static(r.GetPeer().GetAddress()) {
		return nil, status.Errorf(codes.AlreadyExists, "peer.address: %s is already configured in lbd's configuration file", r.GetPeer().GetAddress())
	}
	p, err := s.st.CreateBgpPeer(r.GetPeer())
	if err != nil {
		return nil, err
	}
	s.log.Info("bgp peer added", "op", "create-bgp-peer", "peer", p.Address, "as", p.PeerAs)
	return &lbdv1.CreateBgpPeerResponse{Peer: s.peerStatus(ctx, p)}, nil
}

// GetBgpPeer implements lbdv1.BgpServiceServer.
func (s *Server) GetBgpPeer(ctx context.Context, r *lbdv1.GetBgpPeerRequest) (*lbdv1.GetBgpPeerResponse, error) {
	if s.opts.BGP != nil {
		peers, err := s.opts.BGP.Peers(ctx)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "list peers: %v", err)
		}
		for _, p := range peers {
			if p.Address == r.GetAddress() {
				return &lbdv1.GetBgpPeerResponse{Peer: p}, nil
			}
		}
	}
	p, err := s.st.GetBgpPeer(r.GetAddress())
	if err != nil {
		return nil, err
	}
	return &lbdv1.GetBgpPeerResponse{Peer: s.peerStatus(ctx, p)}, nil
}

// ListBgpPeers implements lbdv1.BgpServiceServer.
func (s *Server) ListBgpPeers(ctx context.Context, _ *lbdv1.ListBgpPeersRequest) (*lbdv1.ListBgpPeersResponse, error) {
	peers, err := s.listPeers(ctx)
	if err != nil {
		return nil, err
	}
	return &lbdv1.ListBgpPeersResponse{Peers: peers}, nil
}

// UpdateBgpPeer implements lbdv1.BgpServiceServer.
func (s *Server) UpdateBgpPeer(ctx context.Context, r *lbdv1.UpdateBgpPeerRequest) (*lbdv1.UpdateBgpPeerResponse, error) {
	if err := s.checkNotStatic(r.GetPeer().GetAddress()); err != nil {
		return nil, err
	}
	p, err := s.st.UpdateBgpPeer(r.GetPeer())
	if err != nil {
		return nil, err
	}
	s.log.Info("bgp peer updated", "op", "update-bgp-peer", "peer", p.Address)
	return &lbdv1.UpdateBgpPeerResponse{Peer: s.peerStatus(ctx, p)}, nil
}

// DeleteBgpPeer implements lbdv1.BgpServiceServer.
func (s *Server) DeleteBgpPeer(_ context.Context, r *lbdv1.DeleteBgpPeerRequest) (*lbdv1.DeleteBgpPeerResponse, error) {
	if err := s.checkNotStatic(r.GetAddress()); err != nil {
		return nil, err
	}
	if err := s.st.DeleteBgpPeer(r.GetAddress()); err != nil {
		return nil, err
	}
	s.log.Info("bgp peer deleted", "op", "delete-bgp-peer", "peer", r.GetAddress())
	return &lbdv1.DeleteBgpPeerResponse{}, nil
}

// ListBgpRoutes implements lbdv1.BgpServiceServer.
func (s *Server) ListBgpRoutes(ctx context.Context, _ *lbdv1.ListBgpRoutesRequest) (*lbdv1.ListBgpRoutesResponse, error) {
	if s.opts.BGP == nil {
		// Like ListBgpPeers, an answer: a node without a speaker advertises nothing.
		return &lbdv1.ListBgpRoutesResponse{NoSpeaker: true}, nil
	}
	routes, err := s.opts.BGP.Routes(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "list routes: %v", err)
	}
	return &lbdv1.ListBgpRoutesResponse{Routes: routes}, nil
}
