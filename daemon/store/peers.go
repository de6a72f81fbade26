package store

import (
	"maps"
	"net/netip"
	"slices"

	"github.com/lbd-dev/lbd/daemon/model"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/proto"
)

// CreateBgpPeer adds a BGP peer.
func (s *Store) CreateBgpPeer(in *lbdv1.BgpPeer) (*lbdv1.BgpPeer, error) {
	p, addr, verr := normalizePeer(in)
	if verr != nil {
		return nil, verr
	}
	t := s.begin()
	if _, ok := t.peers[addr]; ok {
		t.abort()
		return nil, alreadyExists("peer.address", "peer %s already exists", p.Address)
	}
	if len(t.peers) >= s.opts.Limits.MaxBgpPeers {
		t.abort()
		return nil, failedPrecondition("", "the limit of %d BGP peers is reached", s.opts.Limits.MaxBgpPeers)
	}
	t.peers[addr] = p
	t.events = append(t.events, Event{Type: Node})
	if err := t.commit(); err != nil {
		return nil, err
	}
	return publicPeer(p), nil
}

// UpdateBgpPeer replaces a peer's configuration.
func (s *Store) UpdateBgpPeer(in *lbdv1.BgpPeer) (*lbdv1.BgpPeer, error) {
	p, addr, verr := normalizePeer(in)
	if verr != nil {
		return nil, verr
	}
	t := s.begin()
	if _, ok := t.peers[addr]; !ok {
		t.abort()
		return nil, notFound("peer %s not found", p.Address)
	}
	t.peers[addr] = p
	t.events = append(t.events, Event{Type: Node})
	if err := t.commit(); err != nil {
		return nil, err
	}
	return publicPeer(p), nil
}

// DeleteBgpPeer removes a peer.
func (s *Store) DeleteBgpPeer(address string) error {
	a, err := parsePeerRef(address)
	if err != nil {
		return err
	}
	t := s.begin()
	if _, ok := t.peers[a]; !ok {
		t.abort()
		return notFound("peer %s not found", address)
	}
	delete(t.peers, a)
	t.events = append(t.events, Event{Type: Node})
	return t.commit()
}

// GetBgpPeer returns one peer, without its password.
func (s *Store) GetBgpPeer(address string) (*lbdv1.BgpPeer, error) {
	a, err := parsePeerRef(address)
	if err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	p, ok := s.peers[a]
	if !ok {
		return nil, notFound("peer %s not found", address)
	}
	return publicPeer(p), nil
}

// ListBgpPeers returns all peers sorted by address, without passwords.
func (s *Store) ListBgpPeers() []*lbdv1.BgpPeer {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*lbdv1.BgpPeer, 0, len(s.peers))
	for _, a := range slices.SortedFunc(maps.Keys(s.peers), netip.Addr.Compare) {
		out = append(out, publicPeer(s.peers[a]))
	}
	return out
}

// BgpPeers returns all peers sorted by address, with their addresses parsed, and
// with their passwords only if withSecrets (for the BGP speaker).
func (s *Store) BgpPeers(withSecrets bool) []model.Peer {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]model.Peer, 0, len(s.peers))
	for _, a := range slices.SortedFunc(maps.Keys(s.peers), netip.Addr.Compare) {
		p := proto.Clone(s.peers[a]).(*lbdv1.BgpPeer)
		if !withSecrets {
			p.Password = ""
		}
		out = append(out, model.Peer{Spec: p, Addr: a})
	}
	return out
}

func publicPeer(p *lbdv1.BgpPeer) *lbdv1.BgpPeer {
	c := proto.Clone(p).(*lbdv1.BgpPeer)
	c.Password = ""
	return c
}
