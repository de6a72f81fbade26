package advertise

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/reconcile"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/apiutil"
	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
	"github.com/osrg/gobgp/v3/pkg/packet/bgp"
	"github.com/osrg/gobgp/v3/pkg/server"
)

// The tests run the controller's speaker against plain GoBGP instances playing the
// edge routers, all on loopback: no root, no network.

const (
	routerAS  = 65000
	speakerAS = 65001
	// waitFor bounds every wait; generous for a loaded 2-core machine.
	waitFor = 45 * time.Second
)

// testLogger writes into the test log and keeps quiet once the test is over (GoBGP
// goroutines may still log then).
func testLogger(t *testing.T) hclog.Logger {
	t.Helper()
	w := &testWriter{t: t}
	t.Cleanup(w.close)
	level := hclog.Warn
	if testing.Verbose() {
		level = hclog.Info
	}
	return hclog.New(&hclog.LoggerOptions{Name: t.Name(), Output: w, Level: level})
}

type testWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (w *testWriter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
}

// routerLog sends the router's warnings and errors to the test log.
type routerLog struct{ l hclog.Logger }

func (r routerLog) Panic(msg string, _ gobgplog.Fields) { r.l.Error(msg); panic(msg) }
func (r routerLog) Fatal(msg string, _ gobgplog.Fields) { r.l.Error(msg); panic(msg) }
func (r routerLog) Error(msg string, f gobgplog.Fields) { r.l.Error(msg, "fields", fmt.Sprint(f)) }
func (r routerLog) Warn(msg string, f gobgplog.Fields)  { r.l.Warn(msg, "fields", fmt.Sprint(f)) }
func (r routerLog) Info(string, gobgplog.Fields)        {}
func (r routerLog) Debug(string, gobgplog.Fields)       {}
func (r routerLog) SetLevel(gobgplog.LogLevel)          {}
func (r routerLog) GetLevel() gobgplog.LogLevel         { return gobgplog.WarnLevel }

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitFor)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls f until it returns nil, failing the test with f's last error after
// waitFor.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %s: %v", what, waitFor, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// freePort returns a TCP port that was free on addr a moment ago.
func freePort(t *testing.T, addr string) uint16 {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatalf("find free port: %v", err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

// testRouter is a plain GoBGP instance acting as an edge router.
type testRouter struct {
	t    *testing.T
	s    *server.BgpServer
	addr string
	port uint16
}

// newTestRouter starts a router listening on addr, with the speaker (which connects
// from 127.0.0.1) as a passive neighbor.
func newTestRouter(t *testing.T, addr string, gracefulRestart bool) *testRouter {
	t.Helper()
	if raceEnabled {
		// GoBGP v3.37.0 is not race-clean with two instances in one process: StartBgp
		// writes package globals that every instance reads.
		t.Skip("GoBGP races with itself when two instances share a process; run without -race")
	}
	ctx := testContext(t)
	var r *testRouter
	var lastErr error
	// The free port can be taken between the probe and the bind: retry.
	for range 5 {
		port := freePort(t, addr)
		s := server.NewBgpServer(server.LoggerOption(routerLog{testLogger(t).Named("router")}))
		go s.Serve()
		err := s.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{
			Asn:             routerAS,
			RouterId:        "198.18.255.1",
			ListenPort:      int32(port),
			ListenAddresses: []string{addr},
		}})
		if err == nil {
			t.Cleanup(s.Stop)
			r = &testRouter{t: t, s: s, addr: addr, port: port}
			break
		}
		lastErr = err
		s.Stop()
	}
	if r == nil {
		t.Fatalf("start router on %s: %v", addr, lastErr)
	}
	afs := []*api.AfiSafi{}
	for _, afi := range []api.Family_Afi{api.Family_AFI_IP, api.Family_AFI_IP6} {
		afs = append(afs, &api.AfiSafi{
			Config:            &api.AfiSafiConfig{Family: &api.Family{Afi: afi, Safi: api.Family_SAFI_UNICAST}, Enabled: true},
			MpGracefulRestart: &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: gracefulRestart}},
		})
	}
	peer := &api.Peer{
		Conf:      &api.PeerConf{NeighborAddress: "127.0.0.1", PeerAsn: speakerAS},
		Transport: &api.Transport{PassiveMode: true},
		AfiSafis:  afs,
	}
	if gracefulRestart {
		peer.GracefulRestart = &api.GracefulRestart{Enabled: true, RestartTime: 90}
	}
	if err := r.s.AddPeer(ctx, &api.AddPeerRequest{Peer: peer}); err != nil {
		t.Fatalf("router: add neighbor: %v", err)
	}
	return r
}

// peer is the speaker's static configuration of this router.
func (r *testRouter) peer(gracefulRestart bool) Peer {
	return Peer{
		Address:         r.addr,
		AS:              routerAS,
		Port:            uint32(r.port),
		ConnectRetry:    Duration(time.Second),
		GracefulRestart: GracefulRestart{Enabled: gracefulRestart},
	}
}

// established reports whether the router's session with the speaker is up.
func (r *testRouter) established() (bool, error) {
	var state api.PeerState_SessionState
	err := r.s.ListPeer(testContext(r.t), &api.ListPeerRequest{Address: "127.0.0.1"}, func(p *api.Peer) {
		state = p.GetState().GetSessionState()
	})
	return state == api.PeerState_ESTABLISHED, err
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
		err := r.s.ListPath(testContext(r.t), &api.ListPathRequest{
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
	r.t.Helper()
	var rib map[netip.Prefix]ribRoute
	w := slices.Clone(want)
	slices.SortFunc(w, comparePrefix)
	eventually(r.t, fmt.Sprintf("router %s RIB = %v", r.addr, w), func() error {
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
		LocalAS:   speakerAS,
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
	c, err := New(cfg, st, r.attached.Load, false, testLogger(t))
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
	eventually(t, "speaker started", func() error {
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
	case <-time.After(waitFor):
		t.Fatalf("Run did not return within %s of its context ending", waitFor)
	}
}

// peer returns the controller's view of the peer at addr.
func (r *running) peer(t *testing.T, addr string) (*lbdv1.BgpPeer, error) {
	t.Helper()
	peers, err := r.Peers(testContext(t))
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
	eventually(t, "session with "+addr+" established", func() error {
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
	eventually(t, fmt.Sprintf("service %s advertised=%v %q", name, advertised, reason), func() error {
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
