// Package bgp is lbd's BGP speaker: it tells the edge routers which VIPs this
// node serves. It embeds GoBGP, hidden behind the Speaker type so that a GoBGP
// upgrade touches gobgp.go only.
//
// The caller hands SetAdvertised the full set of VIPs it wants announced
// (MetalLB style); the speaker diffs it against what is announced and sends
// only the difference.
//
// Stopping and restarting: Stop is for good. It closes every session with a
// Cease NOTIFICATION, so peers drop this node's routes at once, graceful
// restart or not. To restart the daemon without a routing change, do not call
// Stop: let the process exit. The kernel then closes the TCP connections
// without a NOTIFICATION, and peers that negotiated graceful restart keep the
// routes (marked stale) for the restart time. The new process starts with
// Config.Restarting set and calls SetAdvertised with the full set; peers then
// replace the stale routes and drop those that were not announced again.
// Without graceful restart the routes go away when the old sessions close.
package bgp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// SessionState is the BGP finite state machine state of a session (RFC 4271).
type SessionState string

// Session states, in the order a session goes through them.
const (
	StateUnknown     SessionState = "unknown"
	StateIdle        SessionState = "idle"
	StateConnect     SessionState = "connect"
	StateActive      SessionState = "active"
	StateOpenSent    SessionState = "opensent"
	StateOpenConfirm SessionState = "openconfirm"
	StateEstablished SessionState = "established"
)

// PeerStatus is what `gobgp neighbor` shows for one peer.
type PeerStatus struct {
	Address netip.Addr
	AS      uint32
	State   SessionState
	// RouterID is the neighbor's BGP identifier, once a session came up.
	RouterID netip.Addr
	// Since is when the session was established (State established) or last
	// went down (other states); zero if it never was up.
	Since time.Time
	// Flops counts sessions that went down shortly after coming up.
	Flops uint32
	// GracefulRestart is true when both sides advertised the graceful restart
	// capability on the current session; PeerRestartTime is the neighbor's.
	GracefulRestart bool
	PeerRestartTime time.Duration
	Families        []FamilyStatus
}

// FamilyStatus counts prefixes of one family on a session.
type FamilyStatus struct {
	Family Family
	// Received and Accepted count prefixes from the neighbor.
	Received, Accepted uint64
	// Advertised counts prefixes this node sends to the neighbor.
	Advertised uint64
}

// PeerEvent reports a session state change.
type PeerEvent struct {
	Address netip.Addr
	AS      uint32
	State   SessionState
	// Deleted marks the last event of a peer removed by DeletePeer or UpdatePeer
	// (which adds it again); its State is idle.
	Deleted bool
	Time    time.Time
}

// AdvertisedRoute is a route in the speaker's RIB, as handed to peers.
type AdvertisedRoute struct {
	Route
	// NextHop is the configured next hop; unspecified means the local address of
	// each session.
	NextHop netip.Addr
	// Since is when the route was last announced with these attributes.
	Since time.Time
}

// Change is what one SetAdvertised call changed.
type Change struct {
	// Announced are new prefixes, Updated prefixes re-announced with new
	// attributes, Withdrawn prefixes no longer announced; each sorted.
	Announced, Updated, Withdrawn []netip.Prefix
}

// Empty reports whether nothing was sent.
func (c Change) Empty() bool {
	return len(c.Announced)+len(c.Updated)+len(c.Withdrawn) == 0
}

// Stats counts route changes handed to the BGP stack since Start: every
// announcement (new or updated attributes) and every withdrawal.
type Stats struct {
	Announcements, Withdrawals uint64
}

// Speaker is an embedded BGP speaker. Its methods are safe for concurrent use.
type Speaker struct {
	log hclog.Logger
	cfg Config

	mu         sync.Mutex
	srv        *gobgpServer // nil before Start and after Stop
	stopped    bool
	peers      map[netip.Addr]PeerConfig // with defaults applied
	advertised map[netip.Prefix]Route    // normalized
	stats      Stats
	events     eventHub
}

// New validates cfg and returns a speaker that is not started yet.
func New(cfg Config, logger hclog.Logger) (*Speaker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	cfg.Peers = slices.Clone(cfg.Peers)
	cfg.ListenAddresses = slices.Clone(cfg.ListenAddresses)
	return &Speaker{
		log:        logger,
		cfg:        cfg,
		peers:      make(map[netip.Addr]PeerConfig),
		advertised: make(map[netip.Prefix]Route),
	}, nil
}

// Start runs the BGP stack and adds the configured peers. ctx bounds the start
// only; the speaker runs until Stop. A speaker starts once.
func (s *Speaker) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil || s.stopped {
		return ErrStarted
	}
	srv, err := startGoBGP(ctx, s.cfg, s.log)
	if err != nil {
		return fmt.Errorf("start BGP speaker: %w", err)
	}
	// Watch before adding peers so that watchers see their first sessions.
	if err := srv.watchPeers(srv.life, s.events.publish); err != nil {
		stopErr := srv.stop(context.WithoutCancel(ctx))
		return fmt.Errorf("start BGP speaker: watch peers: %w", errors.Join(err, stopErr))
	}
	for _, p := range s.cfg.Peers {
		p = p.withDefaults()
		if err := srv.addPeer(ctx, p, s.cfg.LocalAS, s.cfg.Restarting); err != nil {
			clear(s.peers)
			stopErr := srv.stop(context.WithoutCancel(ctx))
			return fmt.Errorf("start BGP speaker: add peer %s: %w", p.Address, errors.Join(err, stopErr))
		}
		s.peers[p.Address] = p
	}
	s.srv = srv
	s.log.Info("BGP speaker started", "op", "start", "router_id", s.cfg.RouterID,
		"local_as", s.cfg.LocalAS, "listen_port", s.cfg.ListenPort, "peers", len(s.peers),
		"restarting", s.cfg.Restarting)
	return nil
}

// Stop closes every session with a Cease NOTIFICATION and stops the stack:
// peers drop this node's routes at once, with or without graceful restart (see
// the package documentation for restarts that keep routes). If ctx ends first,
// Stop returns its error and the shutdown goes on in the background.
func (s *Speaker) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv == nil {
		return ErrNotStarted
	}
	srv := s.srv
	s.srv = nil
	s.stopped = true
	clear(s.advertised)
	if err := srv.stop(ctx); err != nil {
		return fmt.Errorf("stop BGP speaker: %w", err)
	}
	s.log.Info("BGP speaker stopped", "op", "stop")
	return nil
}

// AddPeer validates and adds a peer; an invalid or duplicate peer changes nothing.
func (s *Speaker) AddPeer(ctx context.Context, p PeerConfig) error {
	if err := s.cfg.validatePeer(&p); err != nil {
		return err
	}
	p = p.withDefaults()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv == nil {
		return ErrNotStarted
	}
	if _, ok := s.peers[p.Address]; ok {
		return fmt.Errorf("add peer %s: %w", p.Address, ErrPeerExists)
	}
	if err := s.srv.addPeer(ctx, p, s.cfg.LocalAS, false); err != nil {
		return fmt.Errorf("add peer %s: %w", p.Address, err)
	}
	s.peers[p.Address] = p
	s.log.Info("peer added", "op", "add-peer", "peer", p.Address, "as", p.AS)
	return nil
}

// UpdatePeer replaces the configuration of an existing peer. A changed peer's
// session is reset (closed with a NOTIFICATION and opened again), so the peer
// drops and relearns this node's routes; an unchanged configuration is a no-op.
func (s *Speaker) UpdatePeer(ctx context.Context, p PeerConfig) error {
	if err := s.cfg.validatePeer(&p); err != nil {
		return err
	}
	p = p.withDefaults()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv == nil {
		return ErrNotStarted
	}
	old, ok := s.peers[p.Address]
	if !ok {
		return fmt.Errorf("update peer %s: %w", p.Address, ErrPeerNotFound)
	}
	if old.equal(p) {
		return nil
	}
	if err := s.srv.deletePeer(ctx, p.Address); err != nil {
		return fmt.Errorf("update peer %s: %w", p.Address, err)
	}
	delete(s.peers, p.Address)
	s.publishDeleted(old)
	if err := s.srv.addPeer(ctx, p, s.cfg.LocalAS, false); err != nil {
		// Put the old session back so that a failed update changes nothing.
		if restoreErr := s.srv.addPeer(ctx, old, s.cfg.LocalAS, false); restoreErr == nil {
			s.peers[old.Address] = old
		} else {
			err = errors.Join(err, fmt.Errorf("restore old configuration: %w", restoreErr))
		}
		return fmt.Errorf("update peer %s: %w", p.Address, err)
	}
	s.peers[p.Address] = p
	s.log.Info("peer updated", "op", "update-peer", "peer", p.Address, "as", p.AS)
	return nil
}

// DeletePeer closes the session with a Cease NOTIFICATION and forgets the peer.
func (s *Speaker) DeletePeer(ctx context.Context, addr netip.Addr) error {
	addr = addr.Unmap()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv == nil {
		return ErrNotStarted
	}
	if _, ok := s.peers[addr]; !ok {
		return fmt.Errorf("delete peer %s: %w", addr, ErrPeerNotFound)
	}
	if err := s.srv.deletePeer(ctx, addr); err != nil {
		return fmt.Errorf("delete peer %s: %w", addr, err)
	}
	s.publishDeleted(s.peers[addr])
	delete(s.peers, addr)
	s.log.Info("peer deleted", "op", "delete-peer", "peer", addr)
	return nil
}

// Peers returns the configured peers (defaults applied), sorted by address.
func (s *Speaker) Peers() []PeerConfig {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]PeerConfig, 0, len(s.peers))
	for _, p := range s.peers {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b PeerConfig) int { return a.Address.Compare(b.Address) })
	return out
}

// ListPeers returns the state of every session, sorted by address.
func (s *Speaker) ListPeers(ctx context.Context) ([]PeerStatus, error) {
	srv, err := s.server()
	if err != nil {
		return nil, err
	}
	peers, err := srv.listPeers(ctx)
	if err != nil {
		return nil, fmt.Errorf("list peers: %w", err)
	}
	slices.SortFunc(peers, func(a, b PeerStatus) int { return a.Address.Compare(b.Address) })
	return peers, nil
}

// SetAdvertised makes the announced VIPs exactly routes: it withdraws the
// prefixes not in routes, announces the new ones and re-announces those whose
// attributes changed; unchanged prefixes send nothing. Invalid input changes
// nothing. On a BGP stack error the changes made so far are kept and reported.
func (s *Speaker) SetAdvertised(ctx context.Context, routes []Route) (Change, error) {
	if err := validateRoutes(routes); err != nil {
		return Change{}, err
	}
	desired := make(map[netip.Prefix]Route, len(routes))
	for _, r := range routes {
		desired[r.Prefix] = r.normalized()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv == nil {
		return Change{}, ErrNotStarted
	}
	var ch Change
	for _, p := range sortedPrefixes(s.advertised) {
		if _, ok := desired[p]; ok {
			continue
		}
		if err := s.srv.withdraw(ctx, s.advertised[p], s.nextHop(p)); err != nil {
			return ch, fmt.Errorf("withdraw %s: %w", p, err)
		}
		delete(s.advertised, p)
		s.stats.Withdrawals++
		ch.Withdrawn = append(ch.Withdrawn, p)
	}
	for _, p := range sortedPrefixes(desired) {
		r := desired[p]
		old, had := s.advertised[p]
		if had && sameAttributes(old, r) {
			continue
		}
		// Announcing a prefix again replaces the old path: peers get one UPDATE.
		if err := s.srv.announce(ctx, r, s.nextHop(p)); err != nil {
			return ch, fmt.Errorf("announce %s: %w", p, err)
		}
		s.advertised[p] = r
		s.stats.Announcements++
		if had {
			ch.Updated = append(ch.Updated, p)
		} else {
			ch.Announced = append(ch.Announced, p)
		}
	}
	if !ch.Empty() {
		s.log.Info("advertised routes changed", "op", "set-advertised", "announced", len(ch.Announced),
			"updated", len(ch.Updated), "withdrawn", len(ch.Withdrawn), "total", len(s.advertised))
	}
	return ch, nil
}

// ListRoutes returns the routes in the speaker's RIB (what `gobgp global rib`
// shows), sorted by prefix.
func (s *Speaker) ListRoutes(ctx context.Context) ([]AdvertisedRoute, error) {
	srv, err := s.server()
	if err != nil {
		return nil, err
	}
	routes, err := srv.listRoutes(ctx)
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	slices.SortFunc(routes, func(a, b AdvertisedRoute) int { return comparePrefix(a.Prefix, b.Prefix) })
	return routes, nil
}

// WatchPeers calls fn for every session state change until ctx ends or the
// speaker stops. Calls come from one goroutine per watch, in order; events
// queue while fn runs, so a slow fn delays no one else.
func (s *Speaker) WatchPeers(ctx context.Context, fn func(PeerEvent)) error {
	srv, err := s.server()
	if err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(srv.life, cancel)
	s.events.subscribe(wctx, func() { stop(); cancel() }, fn)
	return nil
}

// publishDeleted tells watchers that a peer is gone: GoBGP reports no state
// change when a peer is removed.
func (s *Speaker) publishDeleted(p PeerConfig) {
	s.events.publish(PeerEvent{Address: p.Address, AS: p.AS, State: StateIdle, Deleted: true, Time: time.Now()})
}

// eventHub fans peer events out to watchers, each with its own queue.
type eventHub struct {
	mu       sync.Mutex
	watchers map[*peerWatcher]struct{}
}

type peerWatcher struct {
	mu    sync.Mutex
	queue []PeerEvent
	wake  chan struct{}
}

func (h *eventHub) subscribe(ctx context.Context, release func(), fn func(PeerEvent)) {
	w := &peerWatcher{wake: make(chan struct{}, 1)}
	h.mu.Lock()
	if h.watchers == nil {
		h.watchers = make(map[*peerWatcher]struct{})
	}
	h.watchers[w] = struct{}{}
	h.mu.Unlock()
	go func() {
		defer release()
		defer func() {
			h.mu.Lock()
			delete(h.watchers, w)
			h.mu.Unlock()
		}()
		for {
			select {
			case <-ctx.Done():
				return
			case <-w.wake:
			}
			w.mu.Lock()
			batch := w.queue
			w.queue = nil
			w.mu.Unlock()
			for _, e := range batch {
				if ctx.Err() != nil {
					return
				}
				fn(e)
			}
		}
	}()
}

func (h *eventHub) publish(e PeerEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.watchers {
		w.mu.Lock()
		w.queue = append(w.queue, e)
		w.mu.Unlock()
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// Stats returns the route change counters.
func (s *Speaker) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

func (s *Speaker) server() (*gobgpServer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv == nil {
		return nil, ErrNotStarted
	}
	return s.srv, nil
}

// nextHop returns the configured next hop for p's family, or the unspecified
// address, which makes the stack use each session's local address.
func (s *Speaker) nextHop(p netip.Prefix) netip.Addr {
	if p.Addr().Is4() {
		if s.cfg.NextHopIPv4.IsValid() {
			return s.cfg.NextHopIPv4
		}
		return netip.IPv4Unspecified()
	}
	if s.cfg.NextHopIPv6.IsValid() {
		return s.cfg.NextHopIPv6
	}
	return netip.IPv6Unspecified()
}

func sortedPrefixes(m map[netip.Prefix]Route) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(m))
	for p := range m {
		out = append(out, p)
	}
	slices.SortFunc(out, comparePrefix)
	return out
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(a.Bits(), b.Bits())
}
