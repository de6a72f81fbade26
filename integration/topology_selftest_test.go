//go:build linux

package integration

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/lbd-dev/lbd/internal/testnet"
)

// TestTopology checks the testbed itself, without lbd: the router (static routes, as
// no lbd announces anything) spreads the VIPs over the LB nodes and follows changes of its next hops, the client reaches every
// backend's servers through the router (IPv4 and IPv6, TCP and UDP, with the real
// client address), and every LB node reaches every backend node over the fabric. A
// scenario failing while this passes points at lbd, not at the harness.
func TestTopology(t *testing.T) {
	requireEnv(t, "ping")
	tb := newTestbed(t, options{staticRoutes: true})

	// The router's hash spreads client ports over both LB nodes, the same way for the
	// same flow every time.
	via := map[string]int{}
	for sport := 10001; sport <= 10040; sport++ {
		route := func() string {
			return testnet.Run(t, "ip", "-n", tb.routerNS.Name, "route", "get", vip4.String(), "from", client4.String(),
				"iif", tb.routerCIf, "ipproto", "tcp", "sport", fmt.Sprint(sport), "dport", fmt.Sprint(webPort))
		}
		first := route()
		if again := route(); again != first {
			t.Fatalf("sport %d: route %q, then %q", sport, first, again)
		}
		for _, lb := range tb.lbs {
			if strings.Contains(first, "via "+lb.addr4.String()+" ") {
				via[lb.name]++
			}
		}
	}
	if len(via) != len(tb.lbs) {
		t.Errorf("40 client ports routed via %v", via)
	}

	for _, lb := range tb.lbs {
		for _, be := range tb.backends {
			for _, a := range []netip.Addr{be.addr4, be.addr6} {
				lb.ns.Exec(t, "ping", "-c", "1", "-W", "2", a.String())
			}
		}
	}

	for _, be := range tb.backends {
		for _, a := range []netip.Addr{be.addr4, be.addr6} {
			h, err := tb.get(netip.AddrPortFrom(a, httpPort))
			if err != nil {
				t.Fatal(err)
			}
			if h.backend != be.name || h.seen != h.local.String() {
				t.Errorf("GET %v: answered by %s seeing %s, want %s seeing %v", a, h.backend, h.seen, be.name, h.local)
			}

			c, err := tb.dial("udp", netip.AddrPortFrom(a, udpPort))
			if err != nil {
				t.Fatal(err)
			}
			ans, err := ask(c, "ping")
			c.Close()
			if err != nil {
				t.Fatal(err)
			}
			if ans.backend != be.name || ans.seen != c.LocalAddr().String() || ans.payload != "ping" {
				t.Errorf("UDP to %v: answer %+v from local %v", a, ans, c.LocalAddr())
			}
		}
	}

	tb.router.setNextHops(t, tb.lbs[1])
	tb.router.setNextHops(t, tb.lbs...)
}
