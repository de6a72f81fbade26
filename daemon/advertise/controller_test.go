package advertise

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/daemon/bgp"
	"github.com/lbd-dev/lbd/internal/bgptest"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

var (
	vip4 = netip.MustParsePrefix("203.0.113.10/32")
	vip6 = netip.MustParsePrefix("2001:db8:100::10/128")
)

const (
	reasonUp        = "advertised to 1 established peer"
	reasonNoBackend = "withdrawn: no usable backend (advertise policy if-healthy)"
	reasonDrained   = "withdrawn: node is drained (lbctl node undrain)"
	reasonDetached  = "withdrawn: datapath detached"
)

// TestAdvertiseLifecycle walks a VIP through everything that advertises or withdraws
// it, checking the router's RIB and the service's status at each step.
func TestAdvertiseLifecycle(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	r := newTestRouter(t, "127.0.0.1", false)
	c := start(t, testConfig(r.peer(false)), st)
	p := c.waitEstablished(t, "127.0.0.1")
	if want := "graceful restart disabled: a restart of lbd withdraws this node's routes"; p.Status.Reason != want {
		t.Errorf("peer reason = %q, want %q", p.Status.Reason, want)
	}
	if p.Password != "" || p.PeerAs != bgptest.RouterAS || p.Port != uint32(r.Port) || p.HoldTime.AsDuration() != 90*time.Second {
		t.Errorf("peer = %v, want AS %d, port %d, hold 90s, no password", p, bgptest.RouterAS, r.Port)
	}

	if _, err := st.CreateService(service("web", vip4.Addr().String(), "198.18.1.1")); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateService(service("web6", vip6.Addr().String(), "2001:db8:1::1")); err != nil {
		t.Fatal(err)
	}
	rib := r.waitRIB(vip4, vip6)
	med := uint32(50)
	checkRIB(t, rib[vip4], ribRoute{
		nextHop:     netip.MustParseAddr("198.18.0.10"),
		communities: []uint32{65000<<16 | 100, uint32(bgp.CommunityNoExport)},
		large:       []string{"65000:1:2"},
		med:         &med,
	})
	checkRIB(t, rib[vip6], ribRoute{nextHop: netip.MustParseAddr("2001:db8::10"), communities: []uint32{65000<<16 | 600}})
	waitStatus(t, st, "web", true, reasonUp)
	waitStatus(t, st, "web6", true, reasonUp)

	routes, err := c.Routes(bgptest.Context(t))
	if err != nil {
		t.Fatalf("Routes: %v", err)
	}
	want := []*lbdv1.BgpRoute{
		{Prefix: vip4.String(), NextHop: "198.18.0.10", Communities: []string{"65000:100", "no-export"}, LargeCommunities: []string{"65000:1:2"}, Med: 50, ServiceName: "web"},
		{Prefix: vip6.String(), NextHop: "2001:db8::10", Communities: []string{"65000:600"}, ServiceName: "web6"},
	}
	if fmt.Sprint(routes) != fmt.Sprint(want) {
		t.Errorf("Routes = %v\nwant %v", routes, want)
	}
	m, err := c.Metrics(bgptest.Context(t))
	if err != nil {
		t.Fatalf("Metrics: %v", err)
	}
	if !m.Running || m.AdvertisedRoutes != 2 || len(m.Peers) != 1 || !m.Peers[0].Established || m.Peers[0].AdvertisedRoutes != 2 {
		t.Errorf("Metrics = %+v, want running, 2 routes, 1 established peer with 2 routes", m)
	}

	// Every backend disabled: withdrawn, and the status says why.
	if _, err := st.UpdateBackend("web", &lbdv1.Backend{Address: "198.18.1.1", Port: 80, State: lbdv1.BackendState_BACKEND_STATE_DISABLED}); err != nil {
		t.Fatal(err)
	}
	r.waitRIB(vip6)
	waitStatus(t, st, "web", false, reasonNoBackend)

	// Policy ALWAYS advertises without a usable backend.
	svc, err := st.GetService("web")
	if err != nil {
		t.Fatal(err)
	}
	svc.AdvertisePolicy = lbdv1.AdvertisePolicy_ADVERTISE_POLICY_ALWAYS
	if _, err := st.UpdateService(svc, 0); err != nil {
		t.Fatal(err)
	}
	r.waitRIB(vip4, vip6)
	waitStatus(t, st, "web", true, reasonUp)

	// Drain withdraws everything; undrain brings it back.
	if err := st.SetDrained(true); err != nil {
		t.Fatal(err)
	}
	r.waitRIB()
	waitStatus(t, st, "web", false, reasonDrained)
	waitStatus(t, st, "web6", false, reasonDrained)
	if err := st.SetDrained(false); err != nil {
		t.Fatal(err)
	}
	r.waitRIB(vip4, vip6)
	waitStatus(t, st, "web6", true, reasonUp)

	// A detached datapath cannot forward: withdrawn until it is back.
	c.attached.Store(false)
	r.waitRIB()
	waitStatus(t, st, "web", false, reasonDetached)
	c.attached.Store(true)
	r.waitRIB(vip4, vip6)
	waitStatus(t, st, "web", true, reasonUp)

	// A deleted service's VIP goes away.
	if err := st.DeleteService("web6"); err != nil {
		t.Fatal(err)
	}
	r.waitRIB(vip4)

	// Stop for good: everything withdrawn, statuses say so.
	c.stop(t)
	if err := c.Withdraw(bgptest.Context(t)); err != nil {
		t.Fatalf("Withdraw: %v", err)
	}
	r.waitRIB()
	waitStatus(t, st, "web", false, "withdrawn: lbd stopped advertising (datapath detached or lbd stopped for good)")
	peers, err := c.Peers(bgptest.Context(t))
	if err != nil || len(peers) != 1 || peers[0].Status.Reason != notRunning {
		t.Errorf("Peers after Withdraw = %v, %v; want the static peer, %q", peers, err, notRunning)
	}
}

func checkRIB(t *testing.T, got, want ribRoute) {
	t.Helper()
	if got.nextHop != want.nextHop || !slices.Equal(got.communities, want.communities) ||
		!slices.Equal(got.large, want.large) || fmt.Sprint(deref(got.med)) != fmt.Sprint(deref(want.med)) {
		t.Errorf("router has %+v (MED %v), want %+v (MED %v)", got, deref(got.med), want, deref(want.med))
	}
}

func deref(p *uint32) any {
	if p == nil {
		return "none"
	}
	return *p
}

// TestSharedVIP: two services on one VIP (different ports); the VIP stays while one of
// them qualifies, and the other's status explains it.
func TestSharedVIP(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	r := newTestRouter(t, "127.0.0.1", false)
	c := start(t, testConfig(r.peer(false)), st)
	c.waitEstablished(t, "127.0.0.1")

	a := service("a", vip4.Addr().String(), "198.18.1.1")
	b := service("b", vip4.Addr().String())
	b.Port = 443
	for _, s := range []*lbdv1.Service{a, b} {
		if _, err := st.CreateService(s); err != nil {
			t.Fatal(err)
		}
	}
	r.waitRIB(vip4)
	waitStatus(t, st, "a", true, reasonUp)
	waitStatus(t, st, "b", true, reasonUp+" for service a; this service alone would be withdrawn: no usable backend (advertise policy if-healthy)")
	routes, err := c.Routes(bgptest.Context(t))
	if err != nil || len(routes) != 1 || routes[0].ServiceName != "a" {
		t.Errorf("Routes = %v, %v; want %s for service a", routes, err, vip4)
	}
	if err := st.DeleteService("a"); err != nil {
		t.Fatal(err)
	}
	r.waitRIB()
	waitStatus(t, st, "b", false, reasonNoBackend)
}

// TestPeerFromStore: a peer created through the API (the store) is configured in the
// speaker, establishes, follows updates, and goes away when deleted.
func TestPeerFromStore(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	r := newTestRouter(t, "127.0.0.1", true)
	c := start(t, testConfig(), st)
	if _, err := st.CreateService(service("web", vip4.Addr().String(), "198.18.1.1")); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, st, "web", false, "not advertised: no BGP peer is established yet (ipv4-unicast)")

	_, err := st.CreateBgpPeer(&lbdv1.BgpPeer{
		Address: "127.0.0.1", PeerAs: bgptest.RouterAS, Port: uint32(r.Port), Password: "",
		GracefulRestart: true, GracefulRestartTime: durationpb.New(60 * time.Second),
	})
	if err != nil {
		t.Fatal(err)
	}
	p := c.waitEstablished(t, "127.0.0.1")
	if c.Static(netip.MustParseAddr("127.0.0.1")) {
		t.Error("Static(127.0.0.1) = true for a peer of the API")
	}
	if want := "graceful restart negotiated: the peer keeps this node's routes for 1m0s while lbd restarts"; p.Status.Reason != want {
		t.Errorf("peer reason = %q, want %q", p.Status.Reason, want)
	}
	if !p.GracefulRestart || p.GracefulRestartTime.AsDuration() != time.Minute || p.Status.SinceTime == nil {
		t.Errorf("peer = %v, want graceful restart 60s and a since time", p)
	}
	r.waitRIB(vip4)
	waitStatus(t, st, "web", true, reasonUp)

	// An update resets the session with the new configuration.
	_, err = st.UpdateBgpPeer(&lbdv1.BgpPeer{Address: "127.0.0.1", PeerAs: bgptest.RouterAS, Port: uint32(r.Port), HoldTime: durationpb.New(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	bgptest.Eventually(t, "peer updated and established", func() error {
		p, err := c.peer(t, "127.0.0.1")
		if err != nil {
			return err
		}
		if p.HoldTime.AsDuration() != 30*time.Second || p.GracefulRestart ||
			p.Status.State != lbdv1.BgpSessionState_BGP_SESSION_STATE_ESTABLISHED {
			return fmt.Errorf("peer %v", p)
		}
		return nil
	})
	r.waitRIB(vip4)

	if err := st.DeleteBgpPeer("127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	bgptest.Eventually(t, "peer gone", func() error {
		peers, err := c.Peers(bgptest.Context(t))
		if err != nil || len(peers) != 0 {
			return fmt.Errorf("Peers = %v, %v", peers, err)
		}
		return nil
	})
	r.waitRIB()
	waitStatus(t, st, "web", false, "not advertised: no BGP peer is established yet (ipv4-unicast)")
}

// TestShutdownKeepsGracefulRestartRoutes: a plain stop closes the sessions without
// graceful restart (their router withdraws at once) and leaves the graceful-restart ones
// alone, so that a restart changes nothing there; Withdraw then removes the rest.
func TestShutdownKeepsGracefulRestartRoutes(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	withGR := newTestRouter(t, "127.0.0.1", true)
	plain := newTestRouter(t, "127.0.0.2", false)
	c := start(t, testConfig(withGR.peer(true), plain.peer(false)), st)
	c.waitEstablished(t, "127.0.0.1")
	c.waitEstablished(t, "127.0.0.2")
	if _, err := st.CreateService(service("web", vip4.Addr().String(), "198.18.1.1")); err != nil {
		t.Fatal(err)
	}
	withGR.waitRIB(vip4)
	plain.waitRIB(vip4)
	waitStatus(t, st, "web", true, "advertised to 2 established peers")

	c.stop(t)
	plain.waitRIB()
	// The session with graceful restart stays up, the route with it.
	time.Sleep(time.Second)
	if up, err := withGR.established(); err != nil || !up {
		t.Errorf("graceful-restart session after a plain stop: established=%v, %v; want up", up, err)
	}
	withGR.waitRIB(vip4)

	if err := c.Withdraw(bgptest.Context(t)); err != nil {
		t.Fatalf("Withdraw: %v", err)
	}
	withGR.waitRIB()
}

// TestNoEstablishedPeer: with no session up the VIP is still handed to the speaker
// (routers get it once a session comes up), and the status says why it is not on the
// wire. One GoBGP instance only, so this test also runs under -race.
func TestNoEstablishedPeer(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	port := bgptest.FreePort(t, "127.0.0.1") // nobody listens there
	c := start(t, testConfig(Peer{Address: "127.0.0.1", AS: bgptest.RouterAS, Port: uint32(port), ConnectRetry: Duration(time.Second)}), st)
	if _, err := st.CreateService(service("web", vip4.Addr().String(), "198.18.1.1")); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, st, "web", false, "not advertised: no BGP peer is established yet (ipv4-unicast)")
	routes, err := c.Routes(bgptest.Context(t))
	if err != nil || len(routes) != 1 || routes[0].Prefix != vip4.String() {
		t.Errorf("Routes = %v, %v; want %s handed to the speaker", routes, err, vip4)
	}
	p, err := c.peer(t, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.State == lbdv1.BgpSessionState_BGP_SESSION_STATE_ESTABLISHED ||
		!strings.HasPrefix(p.Status.Reason, fmt.Sprintf("not established: connecting to 127.0.0.1:%d every 1s", port)) {
		t.Errorf("peer status = %v, want not established, connecting", p.Status)
	}
	if !c.Static(netip.MustParseAddr("127.0.0.1")) || !c.Static(netip.MustParseAddr("::ffff:127.0.0.1")) || c.Static(netip.MustParseAddr("127.0.0.2")) {
		t.Error("Static: want true for the configured peer only")
	}

	// A peer stored through the API with a static peer's address (the API refuses
	// that, but the file may gain the address later) is ignored: the file wins.
	if _, err := st.CreateBgpPeer(&lbdv1.BgpPeer{Address: "127.0.0.1", PeerAs: 64999, Port: 1179}); err != nil {
		t.Fatal(err)
	}
	// A pass that synced the peers has run once the next service got its status.
	if _, err := st.CreateService(service("web2", "203.0.113.11", "198.18.1.1")); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, st, "web2", false, "not advertised: no BGP peer is established yet (ipv4-unicast)")
	peers, err := c.Peers(bgptest.Context(t))
	if err != nil || len(peers) != 1 || peers[0].PeerAs != bgptest.RouterAS || peers[0].Port != uint32(port) {
		t.Errorf("Peers = %v, %v; want only the static peer", peers, err)
	}
}
