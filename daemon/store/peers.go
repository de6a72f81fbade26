package store

import (
	"net/netip"
	"slices"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/proto"
)

// CreateBgpPeer adds a BGP peer.
func (s *Store) CreateBgpPeer(in *lbdv1.BgpPeer) (*lbdv1.BgpPeer, error) {
	p, verr := normalizePeer(in)
	if verr != nil {
		return nil, verr
	}
	t := s.begin()
	if _, ok := t.peers[p.Address]; ok {
		t.abort()
		return nil, alreadyExists("peer.address", "peer %s already exists", p.Address)
	}
	if len(t.peers) >= s.opts.Limits.MaxBgpPeers {
		t.abort()
		return nil, failedPrecondition("", "the limit of %d BGP peers is reached", s.opts.Limits.MaxBgpPeers)
	}
	t.peers[p.Address] = p
	t.events = append(t.events, Event{Type: Node})
	if err := t.commit(); err != nil {
		return nil, err
	}
	return publicPeer(p), nil
}

// UpdateBgpPeer replaces a peer's configuration.
func (s *Store) UpdateBgpPeer(in *lbdv1.BgpPeer) (*lbdv1.BgpPeer, error) {
	p, verr := normalizePeer(in)
	if verr != nil {
		return nil, verr
	}
	t := s.begin()
	if _, ok := t.peers[p.Address]; !ok {
		t.abort()
		return nil, notFound("peer %s not found", p.Address)
	}
	t.peers[p.Address] = p
	t.events = append(t.events, Event{Type: Node})
	if err := t.commit(); err != nil {
		return nil, err
	}
	return publicPeer(p), nil
}

// DeleteBgpPeer removes a peer.
func (s *Store) DeleteBgpPeer(address string) error {
	a, err := netip.ParseAddr(address)
	if err != nil {
		return invalid("address", "%q is not an IP address", address)
	}
	t := s.begin()
	if _, ok := t.peers[a.Unmap().String()]; !ok {
		t.abort()
		return notFound("peer %s not found", address)
	}
	delete(t.peers, a.Unmap().String())
	t.events = append(t.events, Event{Type: Node})
	return t.commit()
}

// GetBgpPeer returns one peer, without its password.
func (s *Store) GetBgpPeer(address string) (*lbdv1.BgpPeer, error) {
	a, err := netip.ParseAddr(address)
	if err != nil {
		return nil, invalid("address", "%q is not an IP address", address)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	p, ok := s.peers[a.Unmap().String()]
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
	for _, p := range s.peers {
		out = append(out, publicPeer(p))
	}
	slices.SortFunc(out, func(a, b *lbdv1.BgpPeer) int {
		return netip.MustParseAddr(a.Address).Compare(netip.MustParseAddr(b.Address))
	})
	return out
}

// BgpPeersWithSecrets returns all peers including passwords, for the BGP speaker.
func (s *Store) BgpPeersWithSecrets() []*lbdv1.BgpPeer {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*lbdv1.BgpPeer, 0, len(s.peers))
	for _, p := range s.peers {
		out = append(out, proto.Clone(p).(*lbdv1.BgpPeer))
	}
	return out
}

func publicPeer(p *lbdv1.BgpPeer) *lbdv1.BgpPeer {
	c := proto.Clone(p).(*lbdv1.BgpPeer)
	c.Password = ""
	return c
}
