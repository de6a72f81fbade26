package bgp

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/bgptest"
	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/apiutil"
	"github.com/osrg/gobgp/v3/pkg/packet/bgp"
)

// The tests run the speaker against a second, plain GoBGP instance playing the
// edge router, both on loopback: no root, no network.

// testRouter is the edge router, with what the speaker's tests ask of it.
type testRouter struct{ *bgptest.Router }

func newTestRouter(t *testing.T, addr string) *testRouter {
	t.Helper()
	return &testRouter{bgptest.NewRouter(t, addr)}
}

// peerConfig returns the speaker's configuration for this router.
func (r *testRouter) peerConfig() PeerConfig {
	return PeerConfig{
		Address:      r.Addr,
		Port:         r.Port,
		AS:           bgptest.RouterAS,
		ConnectRetry: time.Second,
		Families:     []Family{IPv4Unicast, IPv6Unicast},
	}
}

// gracefulRestartCap returns the graceful restart capability of the
// neighbor's last OPEN, or nil.
func (r *testRouter) gracefulRestartCap(addr string) (*bgp.CapGracefulRestart, error) {
	n, err := r.Neighbor(addr)
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

// rib returns the router's best routes of both families, stale ones included.
func (r *testRouter) rib() (map[netip.Prefix]AdvertisedRoute, error) {
	out := make(map[netip.Prefix]AdvertisedRoute)
	for _, f := range []Family{IPv4Unicast, IPv6Unicast} {
		var convErr error
		err := r.Server.ListPath(bgptest.Context(r.T), &api.ListPathRequest{TableType: api.TableType_GLOBAL, Family: apiFamily(f)},
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
	err := r.Server.ListPath(bgptest.Context(r.T), &api.ListPathRequest{
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
	r.T.Helper()
	nlri := bgp.NewIPAddrPrefix(uint8(prefix.Bits()), prefix.Addr().String())
	path, err := apiutil.NewPath(nlri, false, []bgp.PathAttributeInterface{
		bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP),
		bgp.NewPathAttributeNextHop(nextHop),
	}, time.Now())
	if err != nil {
		r.T.Fatalf("router: build path: %v", err)
	}
	if _, err := r.Server.AddPath(bgptest.Context(r.T), &api.AddPathRequest{TableType: api.TableType_GLOBAL, Path: path}); err != nil {
		r.T.Fatalf("router: announce %s: %v", prefix, err)
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
	r.T.Helper()
	l := &updateLog{}
	ctx, cancel := context.WithCancel(context.Background())
	r.T.Cleanup(cancel)
	err := r.Server.WatchEvent(ctx, &api.WatchEventRequest{Table: &api.WatchEventRequest_Table{
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
		r.T.Fatalf("router: watch updates: %v", err)
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
