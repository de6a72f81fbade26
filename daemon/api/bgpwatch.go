package api

import (
	"context"
	"slices"
	"strings"

	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// peerWatcher is what a BGP speaker tells about its sessions (advertise.Controller).
type peerWatcher interface {
	// WatchPeers calls changed, which does not block, whenever a session may have
	// changed state, until ctx ends.
	WatchPeers(ctx context.Context, changed func())
}

// WatchBgpPeers implements lbdv1.BgpServiceServer: every peer, SYNCED, then each peer
// whose session or configuration changed. The peers are listed again whenever the
// speaker reports a session change or the store a change of its peers, and compared
// with what the watcher was sent.
func (s *Server) WatchBgpPeers(_ *lbdv1.WatchBgpPeersRequest, stream lbdv1.BgpService_WatchBgpPeersServer) error {
	if !s.watchers.acquire() {
		return status.Errorf(codes.ResourceExhausted, "lbd serves at most %d watches at once (api.max_watchers) and that many are open; "+
			"close one, or raise api.max_watchers", s.opts.MaxWatchers)
	}
	defer s.watchers.release()
	ctx := stream.Context()
	poke := make(chan struct{}, 1)
	changed := func() {
		select {
		case poke <- struct{}{}:
		default:
		}
	}
	_, _, cancel := s.st.SnapshotAndListen(func(evs []store.Event) {
		if slices.ContainsFunc(evs, func(ev store.Event) bool { return ev.Type == store.Node }) {
			changed()
		}
	})
	defer cancel()
	if w, ok := s.opts.BGP.(peerWatcher); ok {
		w.WatchPeers(ctx, changed)
	}
	sent := map[string]*lbdv1.BgpPeer{}
	synced := false
	for {
		peers, err := s.listPeers(ctx)
		if err != nil {
			return err
		}
		if err := sendPeerChanges(stream, sent, peers); err != nil {
			return err
		}
		if !synced {
			synced = true
			if err := stream.Send(&lbdv1.WatchBgpPeersResponse{Type: lbdv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED}); err != nil {
				return err
			}
		}
		select {
		case <-poke:
		case <-s.stopping:
			return status.Error(codes.Unavailable, "lbd is shutting down; watch again when it is back")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// listPeers is ListBgpPeers' answer: the speaker's peers with their sessions, or the
// store's without a speaker.
func (s *Server) listPeers(ctx context.Context) ([]*lbdv1.BgpPeer, error) {
	if s.opts.BGP != nil {
		peers, err := s.opts.BGP.Peers(ctx)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "list peers: %v", err)
		}
		return peers, nil
	}
	peers := s.st.ListBgpPeers()
	for _, p := range peers {
		withPeerStatus(p)
	}
	return peers, nil
}

// sendPeerChanges sends what differs between the peers sent and peers, by address
// (new ones ADDED, changed ones MODIFIED, gone ones DELETED), and records peers as sent.
func sendPeerChanges(stream lbdv1.BgpService_WatchBgpPeersServer, sent map[string]*lbdv1.BgpPeer, peers []*lbdv1.BgpPeer) error {
	now := make(map[string]*lbdv1.BgpPeer, len(peers))
	for _, p := range peers {
		now[p.GetAddress()] = p
	}
	var out []*lbdv1.WatchBgpPeersResponse
	for addr, p := range now {
		old, ok := sent[addr]
		switch {
		case !ok:
			out = append(out, &lbdv1.WatchBgpPeersResponse{Type: lbdv1.WatchEventType_WATCH_EVENT_TYPE_ADDED, Peer: p})
		case !proto.Equal(old, p):
			out = append(out, &lbdv1.WatchBgpPeersResponse{Type: lbdv1.WatchEventType_WATCH_EVENT_TYPE_MODIFIED, Peer: p})
		}
	}
	for addr, p := range sent {
		if _, ok := now[addr]; !ok {
			out = append(out, &lbdv1.WatchBgpPeersResponse{Type: lbdv1.WatchEventType_WATCH_EVENT_TYPE_DELETED, Peer: p})
		}
	}
	slices.SortFunc(out, func(a, b *lbdv1.WatchBgpPeersResponse) int {
		return strings.Compare(a.GetPeer().GetAddress(), b.GetPeer().GetAddress())
	})
	for _, r := range out {
		if err := stream.Send(r); err != nil {
			return err
		}
	}
	clear(sent)
	for addr, p := range now {
		sent[addr] = p
	}
	return nil
}
