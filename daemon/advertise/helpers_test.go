package advertise

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/daemon/reconcile"
	"github.com/lbd-dev/lbd/daemon/store"
	"github.com/lbd-dev/lbd/internal/bgptest"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/apiutil"
	"github.com/osrg/gobgp/v3/pkg/packet/bgp"
)

// The tests run the controller's speaker against plain GoBGP instances playing the
// edge routers, all on loopback: no root, no network.

// testRouter is an edge router with the speaker (which connects from 127.0.0.1) as
// a passive neighbor.
type testRouter struct{ *bgptest.Router }

func newTestRouter(t *testing.T, addr string, gracefulRestart bool) *testRouter {
	t.Helper()
	r := &testRouter{bgptest.NewRouter(t, addr)}
	r.AddNeighbor("127.0.0.1", bgptest.NeighborOptions{GracefulRestart: gracefulRestart, RestartTime: 90})
	return r
}

// peer is the speaker's static configuration of this router.
func (r *testRouter) peer(gracefulRestart bool) Peer {
	return Peer{
		Address:         r.Addr.String(),
		AS:              bgptest.RouterAS,
		Port:            uint32(r.Port),
		ConnectRetry:    Duration(time.Second),
		GracefulRestart: GracefulRestart{Enabled: gracefulRestart},
	}
}

// established reports whether the router's session with the speaker is up.
func (r *testRouter) established() (bool, error) {
	p, err := r.Neighbor("127.0.0.1")
	return p.GetState().GetSessionState() == api.PeerState_ESTABLISHED, err
}

// ribRoute is a route as the router received it.
type ribRoute struct {
	nextHop     netip.Addr
	communities []uint32
	large       []string
	med         *uint32
}

// rib returns the router's best routes of both families.
func (r *testRouter) rib() (map[netip.Prefix]ribRoute, error) {
	out := map[netip.Prefix]ribRoute{}
	for _, afi := range []api.Family_Afi{api.Family_AFI_IP, api.Family_AFI_IP6} {
		var convErr error
		err := r.Server.ListPath(bgptest.Context(r.T), &api.ListPathRequest{
			TableType: api.TableType_GLOBAL,
			Family:    &api.Family{Afi: afi, Safi: api.Family_SAFI_UNICAST},
		}, func(d *api.Destination) {
			for _, p := range d.GetPaths() {
				if !p.GetBest() {
					continue
				}
				prefix, rt, err := decodePath(p)
				if err != nil {
					convErr = err
					return
				}
				out[prefix] = rt
			}
		})
		if err != nil {
			return nil, err
		}
		if convErr != nil {
			return nil, convErr
		}
	}
	return out, nil
}

func decodePath(p *api.Path) (netip.Prefix, ribRoute, error) {
	nlri, err := apiutil.GetNativeNlri(p)
	if err != nil {
		return netip.Prefix{}, ribRoute{}, fmt.Errorf("decode NLRI: %w", err)
	}
	prefix, err := netip.ParsePrefix(nlri.String())
	if err != nil {
		return netip.Prefix{}, ribRoute{}, fmt.Errorf("parse prefix %q: %w", nlri.String(), err)
	}
	attrs, err := apiutil.GetNativePathAttributes(p)
	if err != nil {
		return netip.Prefix{}, ribRoute{}, fmt.Errorf("decode attributes: %w", err)
	}
	var rt ribRoute
	for _, a := range attrs {
		switch a := a.(type) {
		case *bgp.PathAttributeNextHop:
			rt.nextHop, _ = netip.AddrFromSlice(a.Value)
		case *bgp.PathAttributeMpReachNLRI:
			rt.nextHop, _ = netip.AddrFromSlice(a.Nexthop)
		case *bgp.PathAttributeMultiExitDisc:
			med := a.Value
			rt.med = &med
		case *bgp.PathAttributeCommunities:
			rt.communities = append(rt.communities, a.Value...)
		case *bgp.PathAttributeLargeCommunities:
			for _, c := range a.Values {
				rt.large = append(rt.large, fmt.Sprintf("%d:%d:%d", c.ASN, c.LocalData1, c.LocalData2))
			}
		}
	}
	rt.nextHop = rt.nextHop.Unmap()
	slices.Sort(rt.communities)
	slices.Sort(rt.large)
	return prefix, rt, nil
}

// waitRIB waits until the router holds exactly the given prefixes.
func (r *testRouter) waitRIB(want ...netip.Prefix) map[netip.Prefix]ribRoute {
	r.T.Helper()
	var rib map[netip.Prefix]ribRoute
	w := slices.Clone(want)
	slices.SortFunc(w, comparePrefix)
	bgptest.Eventually(r.T, fmt.Sprintf("router %s RIB = %v", r.Addr, w), func() error {
		var err error
		if rib, err = r.rib(); err != nil {
			return err
		}
		got := make([]netip.Prefix, 0, len(rib))
		for p := range rib {
			got = append(got, p)
		}
		slices.SortFunc(got, comparePrefix)
		if !slices.Equal(got, w) {
			return fmt.Errorf("RIB has %v", got)
		}
		return nil
	})
	return rib
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// testConfig is a node configuration with the given static peers.
func testConfig(peers ...Peer) Config {
	med := uint32(50)
	return Config{
		RouterID:  "198.18.0.10",
		LocalAS:   bgptest.SpeakerAS,
		NextHopV4: "198.18.0.10",
		NextHopV6: "2001:db8::10",
		Peers:     peers,
		VIPAttributes: []VIPAttributes{
			{Prefix: "203.0.113.0/24", Communities: []string{"no-export", "65000:100"}, LargeCommunities: []string{"65000:1:2"}, MED: &med},
			// Never reached for 203.0.113.x: the first matching entry applies.
			{Prefix: "203.0.113.0/25", Communities: []string{"65000:999"}},
			{Prefix: "2001:db8:100::/48", Communities: []string{"65000:600"}},
		},
	}
}

// openStore opens a store whose services a reconciler programs into a fake datapath,
// as on an LB node: VIPs are only advertised once their service is programmed.
func openStore(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(store.Options{Limits: store.DefaultLimits()})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = reconcile.New(st, reconcile.NewFake(), nil).Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		st.Close()
	})
	return st
}

// running is a controller whose Run goroutine the test controls.
type running struct {
	*Controller
	attached atomic.Bool
	cancel   context.CancelFunc
	done     chan error
}

// start runs a controller on st; the test's cleanup stops it for good.
func start(t *testing.T, cfg Config, st *store.Store) *running {
	t.Helper()
	r := &running{done: make(chan error, 1)}
	r.attached.Store(true)
	c, err := New(cfg, st, r.attached.Load, false, bgptest.Logger(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r.Controller = c
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(func() {
		r.stop(t)
		if err := c.Withdraw(context.Background()); err != nil {
			t.Errorf("Withdraw: %v", err)
		}
	})
	bgptest.Eventually(t, "speaker started", func() error {
		if c.currentSpeaker() == nil {
			return errors.New("not yet")
		}
		return nil
	})
	return r
}

// stop ends Run (a plain daemon stop) and waits for it.
func (r *running) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		r.done <- nil // a later stop returns at once
	case <-time.After(bgptest.WaitFor):
		t.Fatalf("Run did not return within %s of its context ending", bgptest.WaitFor)
	}
}

// peer returns the controller's view of the peer at addr.
func (r *running) peer(t *testing.T, addr string) (*lbdv1.BgpPeer, error) {
	t.Helper()
	peers, err := r.Peers(bgptest.Context(t))
	if err != nil {
		return nil, err
	}
	for _, p := range peers {
		if p.Address == addr {
			return p, nil
		}
	}
	return nil, fmt.Errorf("no peer %s in Peers()", addr)
}

func (r *running) waitEstablished(t *testing.T, addr string) *lbdv1.BgpPeer {
	t.Helper()
	var p *lbdv1.BgpPeer
	bgptest.Eventually(t, "session with "+addr+" established", func() error {
		var err error
		if p, err = r.peer(t, addr); err != nil {
			return err
		}
		if s := p.GetStatus().GetState(); s != lbdv1.BgpSessionState_BGP_SESSION_STATE_ESTABLISHED {
			return fmt.Errorf("state %s (%s)", s, p.GetStatus().GetReason())
		}
		return nil
	})
	return p
}

// waitStatus waits until the service's advertise status is (advertised, reason).
func waitStatus(t *testing.T, st *store.Store, name string, advertised bool, reason string) {
	t.Helper()
	bgptest.Eventually(t, fmt.Sprintf("service %s advertised=%v %q", name, advertised, reason), func() error {
		svc, err := st.GetService(name)
		if err != nil {
			return err
		}
		if s := svc.GetStatus(); s.GetAdvertised() != advertised || s.GetAdvertiseReason() != reason {
			return fmt.Errorf("advertised=%v %q", s.GetAdvertised(), s.GetAdvertiseReason())
		}
		return nil
	})
}

func service(name, vip string, backends ...string) *lbdv1.Service {
	s := &lbdv1.Service{Name: name, Vip: vip, Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP}
	for _, b := range backends {
		s.Backends = append(s.Backends, &lbdv1.Backend{Address: b, Port: 80})
	}
	return s
}
