//go:build linux

package integration

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// The end-to-end scenarios of issue 9: the LB daemons announce their VIPs to a real
// BIRD over BGP, and the router's kernel ECMP route follows.

// Extra VIPs, so that a scenario's service does not share the default services' VIP.
var (
	vipNew  = netip.MustParseAddr("203.0.113.20")
	vipNew6 = netip.MustParseAddr("2001:db8:5::20")
	vipSolo = netip.MustParseAddr("203.0.113.30")
)

// service returns a service as `lbctl service get NAME -o json` shows it.
func (d *daemon) service(t *testing.T, name string) *lbdv1.Service {
	t.Helper()
	var svc lbdv1.Service
	d.lbctlJSON(t, &svc, "service", "get", name)
	return &svc
}

// peers returns the BGP peers as `lbctl bgp peers -o json` shows them.
func (d *daemon) peers(t *testing.T) []*lbdv1.BgpPeer {
	t.Helper()
	var resp lbdv1.ListBgpPeersResponse
	d.lbctlJSON(t, &resp, "bgp", "peers")
	return resp.GetPeers()
}

// waitEstablished waits until the daemon's session with the router is established.
func (d *daemon) waitEstablished(t *testing.T, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, func() error {
		ps := d.peers(t)
		if len(ps) != 1 || ps[0].GetAddress() != routerFabric4.String() {
			return fmt.Errorf("%s: peers %v, want the router %v alone", d.node.name, ps, routerFabric4)
		}
		if st := ps[0].GetStatus().GetState(); st != lbdv1.BgpSessionState_BGP_SESSION_STATE_ESTABLISHED {
			return fmt.Errorf("%s: session with the router is %v: %s", d.node.name, st, ps[0].GetStatus().GetReason())
		}
		return nil
	})
}

// protocol returns the state and info columns of one BGP protocol in `birdc show
// protocols` ("up Established", "start Active", "down").
func (r *bird) protocol(t *testing.T, name string) string {
	t.Helper()
	out, err := r.birdc("show", "protocols", name)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		// name proto table state since [info]; "since" is a time of day.
		if len(f) >= 5 && f[0] == name {
			return strings.Join(append([]string{f[3]}, f[5:]...), " ")
		}
	}
	t.Fatalf("birdc show protocols %s: %q", name, out)
	return ""
}

// routeWatch samples the router's kernel route to a VIP every 50 ms and records every
// sample that differs from the expected next hops.
type routeWatch struct {
	stop, done chan struct{}
	mu         sync.Mutex
	samples    int
	bad        []string
}

func (r *bird) watch(vip netip.Addr, lbs []*node) *routeWatch {
	want := gateways(vip, lbs)
	w := &routeWatch{stop: make(chan struct{}), done: make(chan struct{})}
	start := time.Now()
	go func() {
		defer close(w.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
			got, err := kernelNextHops(r.tb.routerNS, vip)
			w.mu.Lock()
			w.samples++
			if err != nil || !slices.Equal(got, want) {
				w.bad = append(w.bad, fmt.Sprintf("%v: via %v (%v)", time.Since(start).Round(time.Millisecond), got, err))
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// Stop ends the sampling and returns the number of samples and the bad ones.
func (w *routeWatch) Stop() (int, []string) {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.samples, w.bad
}

// otherLB returns the LB node that is not n (the testbed has two).
func (tb *testbed) otherLB(n *node) *node {
	for _, lb := range tb.lbs {
		if lb != n {
			return lb
		}
	}
	tb.t.Fatal("no other LB node")
	return nil
}

// TestBGPAdvertise: a new service's VIP appears at the router with every LB node as
// an ECMP next hop within 5 s (IPv4 and IPv6, one session per LB node carrying both),
// `lbctl bgp peers` shows the established sessions, the status says advertised, and
// deleting the service withdraws the VIP.
func TestBGPAdvertise(t *testing.T) {
	tb := newLB(t, options{})
	var web4, web6 []string
	for _, be := range tb.backends {
		web4 = append(web4, netip.AddrPortFrom(be.addr4, httpPort).String())
		web6 = append(web6, netip.AddrPortFrom(be.addr6, httpPort).String())
	}
	for _, s := range []svcSpec{{"new4", vipNew, webPort, "tcp", web4}, {"new6", vipNew6, webPort, "tcp", web6}} {
		start := time.Now()
		tb.createService(t, s)
		took := time.Since(start) + tb.router.waitNextHops(t, s.vip, tb.lbs, 5*time.Second)
		t.Logf("%s (%v): via every LB node %v after the first lbctl service create", s.name, s.vip, took.Round(time.Millisecond))
		if took > 5*time.Second {
			t.Errorf("%s: the router took %v to route the VIP over every LB node, want 5s at most", s.name, took)
		}
		hs := tb.getMany(t, netip.AddrPortFrom(s.vip, webPort), 20)
		t.Logf("%s: 20 requests per backend: %v", s.name, perBackend(hs))
	}
	for _, lb := range tb.lbs {
		ps := lb.lbd.peers(t)
		if len(ps) != 1 {
			t.Fatalf("%s: %d BGP peers, want the router alone", lb.name, len(ps))
		}
		p := ps[0]
		t.Logf("%s: peer %s AS %d: %v, %d routes advertised", lb.name, p.GetAddress(), p.GetPeerAs(),
			p.GetStatus().GetState(), p.GetStatus().GetAdvertisedRoutes())
		if p.GetStatus().GetState() != lbdv1.BgpSessionState_BGP_SESSION_STATE_ESTABLISHED || p.GetPeerAs() != routerAS {
			t.Errorf("%s: session %v with AS %d, want established with AS %d", lb.name, p.GetStatus().GetState(), p.GetPeerAs(), routerAS)
		}
		// vip4 (web, stream, dns), vipNew and vipNew6: what BIRD received.
		if got := p.GetStatus().GetAdvertisedRoutes(); got != 3 {
			out, _ := tb.router.birdc("show", "route", "protocol", lb.name)
			t.Errorf("%s: lbctl bgp peers counts %d routes advertised, want 3; BIRD received:\n%s", lb.name, got, out)
		}
		var routes lbdv1.ListBgpRoutesResponse
		lb.lbd.lbctlJSON(t, &routes, "bgp", "routes")
		var prefixes []string
		for _, r := range routes.GetRoutes() {
			prefixes = append(prefixes, r.GetPrefix())
		}
		slices.Sort(prefixes)
		want := []string{"2001:db8:5::20/128", "203.0.113.10/32", "203.0.113.20/32"}
		if !slices.Equal(prefixes, want) {
			t.Errorf("%s: lbctl bgp routes lists %v, want %v", lb.name, prefixes, want)
		}
		if st := lb.lbd.service(t, "new6").GetStatus(); !st.GetAdvertised() {
			t.Errorf("%s: new6 not advertised: %s", lb.name, st.GetAdvertiseReason())
		}
	}
	if out := tb.router.protocol(t, tb.lbs[0].name); !strings.Contains(out, "Established") {
		t.Errorf("BIRD's session with %s: %s", tb.lbs[0].name, out)
	}

	tb.lbctlLBs(t, "service", "delete", "new4")
	took := tb.router.waitNextHops(t, vipNew, nil, 5*time.Second)
	t.Logf("new4 deleted: the router dropped its VIP after %v", took.Round(time.Millisecond))
}

// TestBGPNodeDrain: `lbctl node drain` on the LB node that carries a long-lived
// connection removes it from the router's ECMP set within 3 s; the connection moves to
// the other LB node, which picks the same backend; undrain brings the node back.
func TestBGPNodeDrain(t *testing.T) {
	tb := newLB(t, options{})
	s := tb.openStream(t, streamVIP)
	if err := s.progress(20, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	from, backend := tb.carrier(t, s.local)
	other := tb.otherLB(from)

	start := time.Now()
	from.lbd.lbctl(t, "node", "drain")
	took := time.Since(start) + tb.router.waitNextHops(t, vip4, []*node{other}, 10*time.Second)
	t.Logf("stream from %v: %s -> %s; %s drained, out of the ECMP set after %v", s.local, from.name, backend,
		from.name, took.Round(time.Millisecond))
	if took > 3*time.Second {
		t.Errorf("drained %s left the router's ECMP set after %v, want 3s at most", from.name, took)
	}
	if err := s.progress(100, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := other.lbd.flowBackend(t, s.local); got != backend {
		t.Fatalf("%s's conntrack has the flow on backend %q, want %s", other.name, got, backend)
	}
	svc := from.lbd.service(t, "stream")
	t.Logf("%s: stream advertised=%v: %s", from.name, svc.GetStatus().GetAdvertised(), svc.GetStatus().GetAdvertiseReason())
	if svc.GetStatus().GetAdvertised() || !strings.Contains(svc.GetStatus().GetAdvertiseReason(), "drained") {
		t.Errorf("%s drained: status advertised=%v %q, want false and a reason naming the drain", from.name,
			svc.GetStatus().GetAdvertised(), svc.GetStatus().GetAdvertiseReason())
	}

	start = time.Now()
	from.lbd.lbctl(t, "node", "undrain")
	took = time.Since(start) + tb.router.waitNextHops(t, vip4, tb.lbs, 10*time.Second)
	t.Logf("%s undrained: back in the ECMP set after %v", from.name, took.Round(time.Millisecond))
	if err := s.progress(30, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestBGPSessionLoss, without graceful restart: SIGSTOP of an LB daemon (a hung
// speaker) makes the router drop the node when the 3 s hold time expires; SIGKILL of
// the daemon carrying a long-lived connection closes its session, the router drops it
// at once, and the connection continues through the other LB node; restarting either
// daemon brings its route back.
func TestBGPSessionLoss(t *testing.T) {
	tb := newLB(t, options{noGracefulRestart: true})
	s := tb.openStream(t, streamVIP)
	from, backend := tb.carrier(t, s.local)
	other := tb.otherLB(from)

	t.Logf("SIGSTOP lbd on %s", other.name)
	if err := other.lbd.proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	t.Cleanup(func() {
		if stopped {
			other.lbd.proc.Signal(syscall.SIGCONT)
		}
	})
	took := tb.router.waitNextHops(t, vip4, []*node{from}, bgpHold+5*time.Second)
	t.Logf("router dropped the hung %s after %v (hold time %v)", other.name, took.Round(time.Millisecond), bgpHold)
	// Between the last keepalive and the hold time's end: at least the hold time less
	// one keepalive interval, at most the hold time and a margin for a loaded machine.
	if took < bgpHold-bgpKeepalive-500*time.Millisecond || took > bgpHold+2*time.Second {
		t.Errorf("the router dropped the hung %s after %v, want about the hold time %v", other.name, took, bgpHold)
	}
	if err := other.lbd.proc.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	took = tb.router.waitNextHops(t, vip4, tb.lbs, 15*time.Second)
	t.Logf("%s resumed: back in the ECMP set after %v", other.name, took.Round(time.Millisecond))

	t.Logf("stream from %v: %s -> %s; SIGKILL lbd on %s", s.local, from.name, backend, from.name)
	start := time.Now()
	from.lbd.crash()
	took = time.Since(start) + tb.router.waitNextHops(t, vip4, []*node{other}, bgpHold+5*time.Second)
	t.Logf("router dropped the killed %s after %v", from.name, took.Round(time.Millisecond))
	if took > bgpHold+time.Second {
		t.Errorf("the router dropped the killed %s after %v, want the hold time %v at most", from.name, took, bgpHold)
	}
	if err := s.progress(100, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := other.lbd.flowBackend(t, s.local); got != backend {
		t.Fatalf("%s's conntrack has the flow on backend %q, want %s", other.name, got, backend)
	}
	before := other.lbd.serviceStats(t, "web").GetNewFlows()
	tb.getMany(t, webVIP, 20)
	if got := other.lbd.serviceStats(t, "web").GetNewFlows() - before; got != 20 {
		t.Errorf("%s took %d of 20 new flows while %s is out of the ECMP set", other.name, got, from.name)
	}

	start = time.Now()
	from.lbd.start(t)
	took = time.Since(start) + tb.router.waitNextHops(t, vip4, tb.lbs, 15*time.Second)
	t.Logf("%s restarted: back in the ECMP set %v after the start", from.name, took.Round(time.Millisecond))
	if err := s.progress(30, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestBGPGracefulRestart: a plain daemon restart (SIGTERM, start) of each LB node in
// turn, with graceful restart negotiated, leaves the router's ECMP set unchanged
// throughout (sampled every 50 ms) while a long-lived connection keeps flowing. The
// restarted daemon's OPEN carries the restart bit, which BIRD shows as "Restart
// recovery" among the neighbor's capabilities; the first start's OPEN does not.
func TestBGPGracefulRestart(t *testing.T) {
	tb := newLB(t, options{})
	restartBit := func(lb *node) bool {
		out, err := tb.router.birdc("show", "protocols", "all", lb.name)
		if err != nil {
			t.Fatal(err)
		}
		_, neighbor, _ := strings.Cut(out, "Neighbor capabilities")
		return strings.Contains(neighbor, "Restart recovery")
	}
	for _, lb := range tb.lbs {
		if restartBit(lb) {
			t.Errorf("%s's first start announced a graceful restart", lb.name)
		}
	}
	s := tb.openStream(t, streamVIP)
	w := tb.router.watch(vip4, tb.lbs)
	for _, lb := range tb.lbs {
		start := time.Now()
		lb.lbd.stop(t)
		t.Logf("%s stopped after %v; BIRD: %s", lb.name, time.Since(start).Round(time.Millisecond), tb.router.protocol(t, lb.name))
		lb.lbd.start(t)
		lb.lbd.waitEstablished(t, 15*time.Second)
		eventually(t, 15*time.Second, func() error {
			if st := tb.router.protocol(t, lb.name); !strings.Contains(st, "Established") {
				return fmt.Errorf("BIRD's session with %s: %s", lb.name, st)
			}
			return nil
		})
		t.Logf("%s restarted, session re-established %v after the SIGTERM", lb.name, time.Since(start).Round(time.Millisecond))
		if !restartBit(lb) {
			t.Errorf("%s restarted without the restart bit in its OPEN", lb.name)
		}
		// Let BIRD take the re-announced routes and End-of-RIB, which ends its stale
		// timer, while the sampling goes on.
		time.Sleep(2 * time.Second)
		if err := s.progress(20, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	n, bad := w.Stop()
	t.Logf("%d route samples during the restarts, %d differ", n, len(bad))
	if len(bad) > 0 {
		t.Errorf("the router's ECMP set changed during graceful restarts: %s", strings.Join(bad, "; "))
	}
}

// TestBGPNoUsableBackend: a service whose backends are all drained, then all
// disabled, gets its VIP withdrawn and its status says why; a usable backend brings it
// back.
func TestBGPNoUsableBackend(t *testing.T) {
	tb := newLB(t, options{})
	var bes []string
	for _, be := range tb.backends {
		bes = append(bes, netip.AddrPortFrom(be.addr4, httpPort).String())
	}
	tb.createService(t, svcSpec{"solo", vipSolo, webPort, "tcp", bes})
	tb.router.waitNextHops(t, vipSolo, tb.lbs, 5*time.Second)
	for _, action := range []struct{ off, offed, on string }{{"drain", "drained", "undrain"}, {"disable", "disabled", "enable"}} {
		start := time.Now()
		for _, b := range bes {
			tb.lbctlLBs(t, "backend", action.off, "solo", b)
		}
		took := time.Since(start) + tb.router.waitNextHops(t, vipSolo, nil, 10*time.Second)
		t.Logf("every backend %s: VIP withdrawn after %v", action.offed, took.Round(time.Millisecond))
		tb.waitService(t, "solo", func(svc *lbdv1.Service) error {
			if st := svc.GetStatus(); st.GetAdvertised() || !strings.Contains(st.GetAdvertiseReason(), "no usable backend") {
				return fmt.Errorf("advertised=%v %q, want false and no usable backend", st.GetAdvertised(), st.GetAdvertiseReason())
			}
			return nil
		})
		for _, lb := range tb.lbs {
			st := lb.lbd.service(t, "solo").GetStatus()
			t.Logf("%s: lbctl service get solo: advertised=%v, %q", lb.name, st.GetAdvertised(), st.GetAdvertiseReason())
		}
		// The VIP shared by the default services stays.
		if got, _ := kernelNextHops(tb.routerNS, vip4); !slices.Equal(got, gateways(vip4, tb.lbs)) {
			t.Errorf("%v via %v while solo's backends are %s", vip4, got, action.offed)
		}
		start = time.Now()
		tb.lbctlLBs(t, "backend", action.on, "solo", bes[0])
		routed := time.Since(start) + tb.router.waitNextHops(t, vipSolo, tb.lbs, 5*time.Second)
		tb.waitService(t, "solo", func(svc *lbdv1.Service) error {
			if !svc.GetStatus().GetAdvertised() {
				return fmt.Errorf("not advertised: %s", svc.GetStatus().GetAdvertiseReason())
			}
			return nil
		})
		// lbd judges a backend usable from the desired state, so the VIP can be routed
		// again some milliseconds before the datapath has the backend (new flows are
		// rejected meanwhile): traffic waits for the Maglev tables.
		tb.waitSlots(t, "solo", netip.MustParseAddrPort(bes[0]), func(n uint32) bool { return n > 0 })
		t.Logf("%s backend %s: VIP routed again after %v, in the Maglev tables after %v", action.on, bes[0],
			routed.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
		tb.getMany(t, netip.AddrPortFrom(vipSolo, webPort), 5)
		for _, b := range bes[1:] {
			tb.lbctlLBs(t, "backend", action.on, "solo", b)
		}
	}
}
