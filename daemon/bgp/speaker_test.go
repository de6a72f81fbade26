package bgp

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/bgptest"
)

var (
	vipA   = netip.MustParsePrefix("203.0.113.10/32")
	vipB   = netip.MustParsePrefix("203.0.113.11/32")
	vipC   = netip.MustParsePrefix("203.0.113.12/32")
	marker = netip.MustParsePrefix("203.0.113.250/32")
	vip6   = netip.MustParsePrefix("2001:db8:100::10/128")

	nextHop4 = netip.MustParseAddr("198.18.0.10")
	nextHop6 = netip.MustParseAddr("2001:db8::10")
)

func med(v uint32) *uint32 { return &v }

func speakerConfig(peers ...PeerConfig) Config {
	return Config{
		RouterID:    netip.MustParseAddr("198.18.0.10"),
		LocalAS:     bgptest.SpeakerAS,
		NextHopIPv4: nextHop4,
		NextHopIPv6: nextHop6,
		Peers:       peers,
	}
}

func startSpeaker(t *testing.T, cfg Config) *Speaker {
	t.Helper()
	s, err := New(cfg, bgptest.Logger(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := s.Start(bgptest.Context(t)); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Stop(bgptest.Context(t)); err != nil && !errors.Is(err, ErrNotStarted) {
			t.Errorf("Stop: %v", err)
		}
	})
	return s
}

// speakerPeer returns the speaker's status of the peer at addr.
func speakerPeer(t *testing.T, s *Speaker, addr netip.Addr) (PeerStatus, error) {
	t.Helper()
	peers, err := s.ListPeers(bgptest.Context(t))
	if err != nil {
		return PeerStatus{}, err
	}
	for _, p := range peers {
		if p.Address == addr {
			return p, nil
		}
	}
	return PeerStatus{}, fmt.Errorf("no peer %s in %v", addr, peers)
}

func waitSpeakerEstablished(t *testing.T, s *Speaker, addr netip.Addr) PeerStatus {
	t.Helper()
	var st PeerStatus
	bgptest.Eventually(t, "speaker session with "+addr.String()+" established", func() error {
		var err error
		st, err = speakerPeer(t, s, addr)
		if err != nil {
			return err
		}
		if st.State != StateEstablished {
			return fmt.Errorf("state %s", st.State)
		}
		return nil
	})
	return st
}

// waitRIB waits until the router's RIB holds exactly the given prefixes.
func waitRIB(t *testing.T, r *testRouter, want ...netip.Prefix) map[netip.Prefix]AdvertisedRoute {
	t.Helper()
	var rib map[netip.Prefix]AdvertisedRoute
	bgptest.Eventually(t, fmt.Sprintf("router RIB = %v", want), func() error {
		var err error
		rib, err = r.rib()
		if err != nil {
			return err
		}
		var got []netip.Prefix
		for p := range rib {
			got = append(got, p)
		}
		slices.SortFunc(got, comparePrefix)
		w := slices.Clone(want)
		slices.SortFunc(w, comparePrefix)
		if !slices.Equal(got, w) {
			return fmt.Errorf("RIB has %v", got)
		}
		return nil
	})
	return rib
}

// setUp starts a router and a speaker peered with it, and waits for the session.
func setUp(t *testing.T, routerOpts bgptest.NeighborOptions, peer func(*PeerConfig)) (*testRouter, *Speaker) {
	t.Helper()
	r := newTestRouter(t, "127.0.0.1")
	r.AddNeighbor("127.0.0.1", routerOpts)
	pc := r.peerConfig()
	if peer != nil {
		peer(&pc)
	}
	s := startSpeaker(t, speakerConfig(pc))
	r.WaitEstablished("127.0.0.1")
	waitSpeakerEstablished(t, s, r.Addr)
	return r, s
}

func TestAdvertiseAndWithdraw(t *testing.T) {
	t.Parallel()
	r, s := setUp(t, bgptest.NeighborOptions{}, nil)

	routes := []Route{
		{
			Prefix:           vipA,
			Communities:      []Community{65000<<16 | 100, CommunityNoExport},
			LargeCommunities: []LargeCommunity{{65000, 1, 2}},
			MED:              med(50),
		},
		{
			Prefix:           vip6,
			Communities:      []Community{65000<<16 | 600},
			LargeCommunities: []LargeCommunity{{65000, 6, 6}, {64999, 1, 1}},
			MED:              med(60),
		},
	}
	ch, err := s.SetAdvertised(bgptest.Context(t), routes)
	if err != nil {
		t.Fatalf("SetAdvertised: %v", err)
	}
	if want := []netip.Prefix{vipA, vip6}; !slices.Equal(ch.Announced, want) || len(ch.Updated)+len(ch.Withdrawn) != 0 {
		t.Errorf("change = %+v, want announced %v only", ch, want)
	}

	rib := waitRIB(t, r, vipA, vip6)
	checkRoute(t, rib[vipA], nextHop4, routes[0])
	checkRoute(t, rib[vip6], nextHop6, routes[1])

	own, err := s.ListRoutes(bgptest.Context(t))
	if err != nil {
		t.Fatalf("ListRoutes: %v", err)
	}
	if len(own) != 2 || own[0].Prefix != vipA || own[1].Prefix != vip6 {
		t.Fatalf("ListRoutes = %+v, want %v and %v", own, vipA, vip6)
	}
	checkRoute(t, own[0], nextHop4, routes[0])
	checkRoute(t, own[1], nextHop6, routes[1])

	st, err := speakerPeer(t, s, r.Addr)
	if err != nil {
		t.Fatal(err)
	}
	want := []FamilyStatus{{Family: IPv4Unicast, Advertised: 1}, {Family: IPv6Unicast, Advertised: 1}}
	if !slices.Equal(st.Families, want) {
		t.Errorf("families = %+v, want %+v", st.Families, want)
	}
	if st.AS != bgptest.RouterAS || st.RouterID != netip.MustParseAddr("198.18.255.1") || st.Since.IsZero() {
		t.Errorf("peer status = %+v, want AS %d, router ID 198.18.255.1, uptime set", st, bgptest.RouterAS)
	}

	ch, err = s.SetAdvertised(bgptest.Context(t), nil)
	if err != nil {
		t.Fatalf("SetAdvertised(nil): %v", err)
	}
	if want := []netip.Prefix{vipA, vip6}; !slices.Equal(ch.Withdrawn, want) {
		t.Errorf("withdrawn = %v, want %v", ch.Withdrawn, want)
	}
	waitRIB(t, r)
	if own, err := s.ListRoutes(bgptest.Context(t)); err != nil || len(own) != 0 {
		t.Errorf("ListRoutes after withdrawal = %v, %v; want none", own, err)
	}
	if got, want := s.Stats(), (Stats{Announcements: 2, Withdrawals: 2}); got != want {
		t.Errorf("stats = %+v, want %+v", got, want)
	}
}

func checkRoute(t *testing.T, got AdvertisedRoute, nextHop netip.Addr, want Route) {
	t.Helper()
	want = want.normalized()
	if got.NextHop != nextHop {
		t.Errorf("%s: next hop %s, want %s", want.Prefix, got.NextHop, nextHop)
	}
	if !sameAttributes(got.Route, want) {
		t.Errorf("%s: attributes %v %v MED %v, want %v %v MED %v", want.Prefix,
			got.Communities, got.LargeCommunities, derefMED(got.MED),
			want.Communities, want.LargeCommunities, derefMED(want.MED))
	}
}

func derefMED(m *uint32) string {
	if m == nil {
		return "none"
	}
	return fmt.Sprint(*m)
}

// TestSetAdvertisedSendsOnlyDifference checks on the wire that unchanged
// prefixes are not sent again. Updates on one session arrive in order, so once
// a marker prefix announced afterwards has arrived, everything before it has.
func TestSetAdvertisedSendsOnlyDifference(t *testing.T) {
	t.Parallel()
	r, s := setUp(t, bgptest.NeighborOptions{}, nil)
	log := r.recordUpdates("127.0.0.1")
	ctx := bgptest.Context(t)

	a := Route{Prefix: vipA, MED: med(10)}
	b := Route{Prefix: vipB}
	if _, err := s.SetAdvertised(ctx, []Route{a, b}); err != nil {
		t.Fatalf("SetAdvertised: %v", err)
	}
	waitRIB(t, r, vipA, vipB)
	// The log is fed by the router's event stream, which can lag behind its RIB: wait
	// for both announcements there too before taking the mark.
	bgptest.Eventually(t, "announcements of A and B recorded", func() error {
		got := log.since(0)
		if !slices.Contains(got, receivedUpdate{vipA, false}) || !slices.Contains(got, receivedUpdate{vipB, false}) {
			return fmt.Errorf("recorded %s", formatUpdates(got))
		}
		return nil
	})

	// The same set again, attributes in another order: nothing to send.
	mark := log.len()
	a2 := Route{Prefix: vipA, MED: med(10)}
	ch, err := s.SetAdvertised(ctx, []Route{b, a2})
	if err != nil || !ch.Empty() {
		t.Fatalf("SetAdvertised(same set) = %+v, %v; want no change", ch, err)
	}
	if got, want := s.Stats(), (Stats{Announcements: 2}); got != want {
		t.Errorf("stats after no-op = %+v, want %+v", got, want)
	}
	m := Route{Prefix: marker}
	if _, err := s.SetAdvertised(ctx, []Route{a, b, m}); err != nil {
		t.Fatalf("SetAdvertised(+marker): %v", err)
	}
	waitRIB(t, r, vipA, vipB, marker)
	if got, want := recordedThrough(t, log, mark, receivedUpdate{marker, false}), []receivedUpdate{{marker, false}}; !slices.Equal(got, want) {
		t.Errorf("router received %s, want %s", formatUpdates(got), formatUpdates(want))
	}

	// Change A's MED, drop B, add C; marker withdrawn last, then re-announced
	// as the end marker.
	mark = log.len()
	aNew := Route{Prefix: vipA, MED: med(20)}
	c := Route{Prefix: vipC, Communities: []Community{65000<<16 | 3}}
	ch, err = s.SetAdvertised(ctx, []Route{aNew, c, m})
	if err != nil {
		t.Fatalf("SetAdvertised(change): %v", err)
	}
	want := Change{Announced: []netip.Prefix{vipC}, Updated: []netip.Prefix{vipA}, Withdrawn: []netip.Prefix{vipB}}
	if !slices.Equal(ch.Announced, want.Announced) || !slices.Equal(ch.Updated, want.Updated) || !slices.Equal(ch.Withdrawn, want.Withdrawn) {
		t.Errorf("change = %+v, want %+v", ch, want)
	}
	rib := waitRIB(t, r, vipA, vipC, marker)
	checkRoute(t, rib[vipA], nextHop4, aNew)
	checkRoute(t, rib[vipC], nextHop4, c)
	m2 := Route{Prefix: marker, MED: med(1)}
	if _, err := s.SetAdvertised(ctx, []Route{aNew, c, m2}); err != nil {
		t.Fatalf("SetAdvertised(marker update): %v", err)
	}
	bgptest.Eventually(t, "marker update received", func() error {
		rib, err := r.rib()
		if err != nil {
			return err
		}
		if got := rib[marker].MED; got == nil || *got != 1 {
			return fmt.Errorf("marker MED %s", derefMED(got))
		}
		return nil
	})
	got := recordedThrough(t, log, mark, receivedUpdate{marker, false})
	wantUpdates := []receivedUpdate{{vipB, true}, {vipA, false}, {vipC, false}, {marker, false}}
	if !slices.Equal(got, wantUpdates) {
		t.Errorf("router received %s, want %s", formatUpdates(got), formatUpdates(wantUpdates))
	}
	if got, want := s.Stats(), (Stats{Announcements: 6, Withdrawals: 1}); got != want {
		t.Errorf("stats = %+v, want %+v", got, want)
	}
}

// recordedThrough waits until the router's update log holds last after index mark and
// returns what it recorded from mark on. Updates on one session arrive in order, so
// everything sent before last is in the log by then.
func recordedThrough(t *testing.T, log *updateLog, mark int, last receivedUpdate) []receivedUpdate {
	t.Helper()
	bgptest.Eventually(t, fmt.Sprintf("%s recorded", last), func() error {
		if got := log.since(mark); !slices.Contains(got, last) {
			return fmt.Errorf("recorded %s", formatUpdates(got))
		}
		return nil
	})
	return log.since(mark)
}

func TestSetAdvertisedRejectsBadInput(t *testing.T) {
	t.Parallel()
	r, s := setUp(t, bgptest.NeighborOptions{}, nil)
	ctx := bgptest.Context(t)
	if _, err := s.SetAdvertised(ctx, []Route{{Prefix: vipA}}); err != nil {
		t.Fatalf("SetAdvertised: %v", err)
	}
	bad := [][]Route{
		{{Prefix: vipA}, {Prefix: vipA}},
		{{Prefix: netip.MustParsePrefix("203.0.113.10/24")}},
		{{}},
	}
	for _, routes := range bad {
		if ch, err := s.SetAdvertised(ctx, routes); !errors.Is(err, ErrInvalidConfig) || !ch.Empty() {
			t.Errorf("SetAdvertised(%v) = %+v, %v; want ErrInvalidConfig and no change", routes, ch, err)
		}
	}
	waitRIB(t, r, vipA)
	if got, want := s.Stats(), (Stats{Announcements: 1}); got != want {
		t.Errorf("stats = %+v, want %+v", got, want)
	}
}

func TestPeerLifecycle(t *testing.T) {
	t.Parallel()
	r := newTestRouter(t, "127.0.0.1")
	r.AddNeighbor("127.0.0.1", bgptest.NeighborOptions{})
	s := startSpeaker(t, speakerConfig())
	ctx := bgptest.Context(t)

	events := make(chan PeerEvent, 100)
	if err := s.WatchPeers(ctx, func(e PeerEvent) { events <- e }); err != nil {
		t.Fatalf("WatchPeers: %v", err)
	}

	// Routes set before the peer exists reach it once the session is up.
	if _, err := s.SetAdvertised(ctx, []Route{{Prefix: vipA}}); err != nil {
		t.Fatalf("SetAdvertised: %v", err)
	}
	pc := r.peerConfig()
	if err := s.AddPeer(ctx, pc); err != nil {
		t.Fatalf("AddPeer: %v", err)
	}
	waitEvent(t, events, "established", func(e PeerEvent) bool {
		return e.Address == r.Addr && e.State == StateEstablished && e.AS == bgptest.RouterAS
	})
	waitSpeakerEstablished(t, s, r.Addr)
	waitRIB(t, r, vipA)

	if err := s.AddPeer(ctx, pc); !errors.Is(err, ErrPeerExists) {
		t.Errorf("AddPeer(duplicate) = %v, want ErrPeerExists", err)
	}
	mapped := pc
	mapped.Address = netip.AddrFrom16(pc.Address.As16()) // ::ffff:127.0.0.1 is the same peer
	if err := s.AddPeer(ctx, mapped); !errors.Is(err, ErrPeerExists) {
		t.Errorf("AddPeer(IPv4-mapped duplicate) = %v, want ErrPeerExists", err)
	}
	badAS := PeerConfig{Address: netip.MustParseAddr("127.0.0.2"), AS: 0}
	if err := s.AddPeer(ctx, badAS); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("AddPeer(AS 0) = %v, want ErrInvalidConfig", err)
	}
	if peers := s.Peers(); len(peers) != 1 || peers[0].Address != pc.Address {
		t.Errorf("Peers after rejected adds = %+v, want only %s", peers, pc.Address)
	}

	// An unchanged configuration keeps the session.
	before, err := speakerPeer(t, s, r.Addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.UpdatePeer(ctx, pc); err != nil {
		t.Fatalf("UpdatePeer(same): %v", err)
	}
	if after, err := speakerPeer(t, s, r.Addr); err != nil || after.State != StateEstablished || !after.Since.Equal(before.Since) {
		t.Errorf("after no-op update: %+v, %v; want the same established session", after, err)
	}

	// A new hold time resets the session and is negotiated.
	updated := pc
	updated.HoldTime = 30 * time.Second
	if err := s.UpdatePeer(ctx, updated); err != nil {
		t.Fatalf("UpdatePeer: %v", err)
	}
	bgptest.Eventually(t, "hold time 30 s negotiated", func() error {
		n, err := r.Neighbor("127.0.0.1")
		if err != nil {
			return err
		}
		if st := n.GetState().GetSessionState(); st.String() != "ESTABLISHED" {
			return fmt.Errorf("state %s", st)
		}
		if h := n.GetTimers().GetState().GetNegotiatedHoldTime(); h != 30 {
			return fmt.Errorf("negotiated hold time %d", h)
		}
		return nil
	})
	waitRIB(t, r, vipA)
	if peers := s.Peers(); len(peers) != 1 || peers[0].HoldTime != 30*time.Second || peers[0].KeepaliveInterval != 10*time.Second {
		t.Errorf("Peers after update = %+v, want hold 30s, keepalive 10s", peers)
	}

	unknown := pc
	unknown.Address = netip.MustParseAddr("127.0.0.3")
	if err := s.UpdatePeer(ctx, unknown); !errors.Is(err, ErrPeerNotFound) {
		t.Errorf("UpdatePeer(unknown) = %v, want ErrPeerNotFound", err)
	}
	if err := s.DeletePeer(ctx, unknown.Address); !errors.Is(err, ErrPeerNotFound) {
		t.Errorf("DeletePeer(unknown) = %v, want ErrPeerNotFound", err)
	}

	// Deleting the peer closes the session: the router drops the route.
	drain(events)
	if err := s.DeletePeer(ctx, pc.Address); err != nil {
		t.Fatalf("DeletePeer: %v", err)
	}
	waitEvent(t, events, "deleted", func(e PeerEvent) bool {
		return e.Address == r.Addr && e.State == StateIdle && e.Deleted
	})
	waitRIB(t, r)
	if peers, err := s.ListPeers(ctx); err != nil || len(peers) != 0 {
		t.Errorf("ListPeers after delete = %+v, %v; want none", peers, err)
	}
	if peers := s.Peers(); len(peers) != 0 {
		t.Errorf("Peers after delete = %+v, want none", peers)
	}
}

func waitEvent(t *testing.T, events <-chan PeerEvent, what string, match func(PeerEvent) bool) {
	t.Helper()
	timeout := time.After(bgptest.WaitFor)
	var seen []PeerEvent
	for {
		select {
		case e := <-events:
			if match(e) {
				return
			}
			seen = append(seen, e)
		case <-timeout:
			t.Fatalf("no %s peer event within %s; saw %+v", what, bgptest.WaitFor, seen)
		}
	}
}

func drain(events <-chan PeerEvent) {
	for {
		select {
		case <-events:
		default:
			return
		}
	}
}

func TestLearnedRoutesAreNotImported(t *testing.T) {
	t.Parallel()
	r, s := setUp(t, bgptest.NeighborOptions{}, nil)
	learned := netip.MustParsePrefix("198.18.128.0/24")
	r.announce(learned, "127.0.0.1")
	bgptest.Eventually(t, "speaker received the router's route", func() error {
		st, err := speakerPeer(t, s, r.Addr)
		if err != nil {
			return err
		}
		for _, f := range st.Families {
			if f.Family == IPv4Unicast && f.Received == 1 {
				return nil
			}
		}
		return fmt.Errorf("families %+v", st.Families)
	})
	routes, err := s.ListRoutes(bgptest.Context(t))
	if err != nil {
		t.Fatalf("ListRoutes: %v", err)
	}
	if len(routes) != 0 {
		t.Errorf("ListRoutes = %+v, want none: learned routes must not enter the RIB", routes)
	}
}

func TestGracefulRestartNegotiated(t *testing.T) {
	t.Parallel()
	r, s := setUp(t, bgptest.NeighborOptions{GracefulRestart: true, RestartTime: 90}, func(p *PeerConfig) {
		p.GracefulRestart = GracefulRestartConfig{Enabled: true, RestartTime: 200 * time.Second}
	})
	st := waitSpeakerEstablished(t, s, r.Addr)
	if !st.GracefulRestart || st.PeerRestartTime != 90*time.Second {
		t.Errorf("speaker: graceful restart %v, peer restart time %s; want true, 90s", st.GracefulRestart, st.PeerRestartTime)
	}
	n, err := r.Neighbor("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	// The router remembers the restart time and families our OPEN announced.
	if got := n.GetGracefulRestart().GetPeerRestartTime(); got != 200 {
		t.Errorf("router: peer restart time %d, want 200", got)
	}
	for _, af := range n.GetAfiSafis() {
		if !af.GetMpGracefulRestart().GetState().GetReceived() {
			t.Errorf("router: no graceful restart tuple received for %v", af.GetConfig().GetFamily())
		}
	}

	// Stop is for good even with graceful restart: the routes go at once.
	if _, err := s.SetAdvertised(bgptest.Context(t), []Route{{Prefix: vipA}}); err != nil {
		t.Fatalf("SetAdvertised: %v", err)
	}
	waitRIB(t, r, vipA)
	if err := s.Stop(bgptest.Context(t)); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	waitRIB(t, r)
	if err := s.Start(bgptest.Context(t)); !errors.Is(err, ErrStarted) {
		t.Errorf("Start after Stop = %v, want ErrStarted", err)
	}
	if _, err := s.SetAdvertised(bgptest.Context(t), nil); !errors.Is(err, ErrNotStarted) {
		t.Errorf("SetAdvertised after Stop = %v, want ErrNotStarted", err)
	}
}

func TestGracefulRestartNotNegotiatedWithoutConfig(t *testing.T) {
	t.Parallel()
	r, s := setUp(t, bgptest.NeighborOptions{GracefulRestart: true, RestartTime: 90}, nil)
	st := waitSpeakerEstablished(t, s, r.Addr)
	if st.GracefulRestart {
		t.Errorf("speaker reports graceful restart negotiated without enabling it")
	}
	n, err := r.Neighbor("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	for _, af := range n.GetAfiSafis() {
		if af.GetMpGracefulRestart().GetState().GetReceived() {
			t.Errorf("router: graceful restart tuple received for %v though disabled", af.GetConfig().GetFamily())
		}
	}
}

func TestMethodsBeforeStart(t *testing.T) {
	t.Parallel()
	s, err := New(speakerConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := bgptest.Context(t)
	if _, err := s.SetAdvertised(ctx, nil); !errors.Is(err, ErrNotStarted) {
		t.Errorf("SetAdvertised = %v, want ErrNotStarted", err)
	}
	if _, err := s.ListPeers(ctx); !errors.Is(err, ErrNotStarted) {
		t.Errorf("ListPeers = %v, want ErrNotStarted", err)
	}
	if err := s.AddPeer(ctx, PeerConfig{Address: netip.MustParseAddr("127.0.0.1"), AS: 1}); !errors.Is(err, ErrNotStarted) {
		t.Errorf("AddPeer = %v, want ErrNotStarted", err)
	}
	if err := s.Stop(ctx); !errors.Is(err, ErrNotStarted) {
		t.Errorf("Stop = %v, want ErrNotStarted", err)
	}
}
