package bgp

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/apiutil"
	"github.com/osrg/gobgp/v3/pkg/packet/bgp"
	"github.com/osrg/gobgp/v3/pkg/server"
)

// The tests run the speaker against a second, plain GoBGP instance playing the
// edge router, both on loopback: no root, no network.

const (
	routerAS  = 65000
	speakerAS = 65001
	// waitFor bounds every wait; generous for a loaded 2-core machine.
	waitFor = 45 * time.Second
)

// testLogger returns an hclog logger that writes into the test log, and keeps
// quiet once the test is over (GoBGP goroutines may still log then). Set
// LBD_BGP_TEST_DEBUG=1 for GoBGP's debug lines.
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

// eventually polls f until it returns nil, failing the test with f's last
// error after waitFor.
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

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitFor)
	t.Cleanup(cancel)
	return ctx
}

// freePort returns a TCP port that was free on addr a moment ago.
func freePort(t *testing.T, addr string) int {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatalf("find free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// testRouter is a plain GoBGP instance acting as the edge router.
type testRouter struct {
	t    *testing.T
	s    *server.BgpServer
	addr netip.Addr
	port uint16
}

func newTestRouter(t *testing.T, addr string) *testRouter {
	t.Helper()
	if raceEnabled {
		// GoBGP v3.37.0 is not race-clean with two instances in one process:
		// StartBgp writes package globals (table.SelectionOptions,
		// table.UseMultiplePaths) that every instance reads, and ListPath reads
		// stale flags that the server goroutine writes.
		t.Skip("GoBGP races with itself when two instances share a process; run without -race")
	}
	ctx := testContext(t)
	var lastErr error
	// The free port can be taken between the probe and the bind: retry.
	for range 5 {
		port := freePort(t, addr)
		s := server.NewBgpServer(server.LoggerOption(hclogAdapter{testLogger(t).Named("router")}))
		go s.Serve()
		err := s.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{
			Asn:             routerAS,
			RouterId:        "198.18.255.1",
			ListenPort:      int32(port),
			ListenAddresses: []string{addr},
		}})
		if err == nil {
			t.Cleanup(s.Stop)
			return &testRouter{t: t, s: s, addr: netip.MustParseAddr(addr), port: uint16(port)}
		}
		lastErr = err
		s.Stop()
	}
	t.Fatalf("start router on %s: %v", addr, lastErr)
	return nil
}

type neighborOpts struct {
	gracefulRestart bool
	restartTime     uint32
	holdTime        uint64
}

// addNeighbor configures the speaker at addr as a passive neighbor: the
// speaker has no listener, so it always connects out.
func (r *testRouter) addNeighbor(addr string, o neighborOpts) {
	r.t.Helper()
	gr := o.gracefulRestart
	peer := &api.Peer{
		Conf:      &api.PeerConf{NeighborAddress: addr, PeerAsn: speakerAS},
		Transport: &api.Transport{PassiveMode: true},
		AfiSafis: []*api.AfiSafi{
			{Config: &api.AfiSafiConfig{Family: apiFamily(IPv4Unicast), Enabled: true},
				MpGracefulRestart: &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: gr}}},
			{Config: &api.AfiSafiConfig{Family: apiFamily(IPv6Unicast), Enabled: true},
				MpGracefulRestart: &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: gr}}},
		},
	}
	if o.holdTime != 0 {
		peer.Timers = &api.Timers{Config: &api.TimersConfig{HoldTime: o.holdTime, KeepaliveInterval: o.holdTime / 3}}
	}
	if gr {
		peer.GracefulRestart = &api.GracefulRestart{Enabled: true, RestartTime: o.restartTime}
	}
	if err := r.s.AddPeer(testContext(r.t), &api.AddPeerRequest{Peer: peer}); err != nil {
		r.t.Fatalf("router: add neighbor %s: %v", addr, err)
	}
}

// peerConfig returns the speaker's configuration for this router.
func (r *testRouter) peerConfig() PeerConfig {
	return PeerConfig{
		Address:      r.addr,
		Port:         r.port,
		AS:           routerAS,
		ConnectRetry: time.Second,
		Families:     []Family{IPv4Unicast, IPv6Unicast},
	}
}

// neighbor returns the router's view of the speaker at addr.
func (r *testRouter) neighbor(addr string) (*api.Peer, error) {
	var found *api.Peer
	err := r.s.ListPeer(testContext(r.t), &api.ListPeerRequest{Address: addr}, func(p *api.Peer) { found = p })
	if err != nil {
		return nil, err
	}
	if found == nil {
		return nil, fmt.Errorf("router has no neighbor %s", addr)
	}
	return found, nil
}

// gracefulRestartCap returns the graceful restart capability of the
// neighbor's last OPEN, or nil.
func (r *testRouter) gracefulRestartCap(addr string) (*bgp.CapGracefulRestart, error) {
	n, err := r.neighbor(addr)
	if err != nil {
		return nil, err
	}
	caps, err := apiutil.UnmarshalCapabilities(n.GetState().GetRemoteCap())
	if err != nil {
		return nil, err
	}
	for _, c := range caps {
		if gr, ok := c.(*bgp.CapGracefulRestart); ok {
			return gr, nil
		}
	}
	return nil, nil
}

func (r *testRouter) waitEstablished(addr string) {
	r.t.Helper()
	eventually(r.t, "router session with "+addr+" established", func() error {
		p, err := r.neighbor(addr)
		if err != nil {
			return err
		}
		if s := p.GetState().GetSessionState(); s != api.PeerState_ESTABLISHED {
			return fmt.Errorf("state %s", s)
		}
		return nil
	})
}

// rib returns the router's best routes of both families, stale ones included.
func (r *testRouter) rib() (map[netip.Prefix]AdvertisedRoute, error) {
	out := make(map[netip.Prefix]AdvertisedRoute)
	for _, f := range []Family{IPv4Unicast, IPv6Unicast} {
		var convErr error
		err := r.s.ListPath(testContext(r.t), &api.ListPathRequest{TableType: api.TableType_GLOBAL, Family: apiFamily(f)},
			func(d *api.Destination) {
				for _, p := range d.GetPaths() {
					if !p.GetBest() {
						continue
					}
					rt, err := routeFromPath(p)
					if err != nil {
						convErr = err
						return
					}
					out[rt.Prefix] = rt
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

// staleIn reports whether the router marks prefix as stale (kept through a
// graceful restart of the neighbor).
func (r *testRouter) stale(prefix netip.Prefix) (bool, error) {
	f := IPv4Unicast
	if prefix.Addr().Is6() {
		f = IPv6Unicast
	}
	found, stale := false, false
	err := r.s.ListPath(testContext(r.t), &api.ListPathRequest{
		TableType: api.TableType_GLOBAL, Family: apiFamily(f),
		Prefixes: []*api.TableLookupPrefix{{Prefix: prefix.String()}},
	}, func(d *api.Destination) {
		for _, p := range d.GetPaths() {
			found = true
			stale = stale || p.GetStale()
		}
	})
	if err != nil {
		return false, err
	}
	if !found {
		return false, fmt.Errorf("router has no route for %s", prefix)
	}
	return stale, nil
}

// announce makes the router originate prefix toward its neighbors.
func (r *testRouter) announce(prefix netip.Prefix, nextHop string) {
	r.t.Helper()
	nlri := bgp.NewIPAddrPrefix(uint8(prefix.Bits()), prefix.Addr().String())
	path, err := apiutil.NewPath(nlri, false, []bgp.PathAttributeInterface{
		bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP),
		bgp.NewPathAttributeNextHop(nextHop),
	}, time.Now())
	if err != nil {
		r.t.Fatalf("router: build path: %v", err)
	}
	if _, err := r.s.AddPath(testContext(r.t), &api.AddPathRequest{TableType: api.TableType_GLOBAL, Path: path}); err != nil {
		r.t.Fatalf("router: announce %s: %v", prefix, err)
	}
}

// receivedUpdate is one prefix of an UPDATE the router received.
type receivedUpdate struct {
	Prefix   netip.Prefix
	Withdraw bool
}

func (u receivedUpdate) String() string {
	if u.Withdraw {
		return "withdraw " + u.Prefix.String()
	}
	return "announce " + u.Prefix.String()
}

// updateLog records every prefix the router receives from one neighbor,
// before policy: exactly what went over the wire.
type updateLog struct {
	mu      sync.Mutex
	updates []receivedUpdate
}

func (r *testRouter) recordUpdates(neighbor string) *updateLog {
	r.t.Helper()
	l := &updateLog{}
	ctx, cancel := context.WithCancel(context.Background())
	r.t.Cleanup(cancel)
	err := r.s.WatchEvent(ctx, &api.WatchEventRequest{Table: &api.WatchEventRequest_Table{
		Filters: []*api.WatchEventRequest_Table_Filter{{
			Type: api.WatchEventRequest_Table_Filter_ADJIN, PeerAddress: neighbor,
		}},
	}}, func(resp *api.WatchEventResponse) {
		for _, p := range resp.GetTable().GetPaths() {
			rt, err := routeFromPath(p)
			if err != nil {
				continue // End-of-RIB markers carry no prefix
			}
			l.mu.Lock()
			l.updates = append(l.updates, receivedUpdate{rt.Prefix, p.GetIsWithdraw()})
			l.mu.Unlock()
		}
	})
	if err != nil {
		r.t.Fatalf("router: watch updates: %v", err)
	}
	return l
}

// since returns the updates recorded from index i on.
func (l *updateLog) since(i int) []receivedUpdate {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]receivedUpdate(nil), l.updates[i:]...)
}

func (l *updateLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.updates)
}

func formatUpdates(us []receivedUpdate) string {
	var b bytes.Buffer
	for i, u := range us {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(u.String())
	}
	return "[" + b.String() + "]"
}
