//go:build linux

package integration

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// The end-to-end scenario of issue 7: LB nodes probe the backends, and a backend whose
// server stops leaves the Maglev tables until it answers again.

// Health check timing of the scenario.
const (
	hcInterval = 200 * time.Millisecond
	hcTimeout  = 100 * time.Millisecond
	hcRise     = 2
	hcFall     = 3
	// hcMargin covers the probes' jitter, the status update and the polling.
	hcMargin = time.Second
)

// vipHC carries the health-checked services.
var vipHC = netip.MustParseAddr("203.0.113.40")

// backendHealth returns the health of a service's backend on one LB node.
func (d *daemon) backendHealth(name string, backend netip.AddrPort) (*lbdv1.Backend, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := d.lb.GetService(ctx, &lbdv1.GetServiceRequest{Name: name})
	if err != nil {
		return nil, fmt.Errorf("%s: get service %s: %w", d.node.name, name, err)
	}
	for _, b := range resp.GetService().GetBackends() {
		if b.GetAddress() == backend.Addr().String() && b.GetPort() == uint32(backend.Port()) {
			return b, nil
		}
	}
	return nil, fmt.Errorf("%s: service %s has no backend %v", d.node.name, name, backend)
}

// waitHealth waits until the backend has the health state, and no Maglev slot when
// DOWN, on every LB node, and returns how long that took; it fails after timeout.
func (tb *testbed) waitHealth(t *testing.T, svc string, backend netip.AddrPort, want lbdv1.HealthState, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		var pending []string
		for _, lb := range tb.lbs {
			b, err := lb.lbd.backendHealth(svc, backend)
			if err != nil {
				t.Fatal(err)
			}
			st := b.GetHealth().GetState()
			if st != want || (want == lbdv1.HealthState_HEALTH_STATE_DOWN) != (b.GetTableSlots() == 0) {
				pending = append(pending, fmt.Sprintf("%s: %v (%q), %d slots", lb.name, st, b.GetHealth().GetLastResult(), b.GetTableSlots()))
			}
		}
		if len(pending) == 0 {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s backend %v not %v after %v: %s", svc, backend, want, timeout, strings.Join(pending, "; "))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHealthCheck: two services over the echo servers, one probed by TCP connects, one
// by HTTP GETs to the backends' HTTP port, every 200 ms with fall 3 and rise 2. When
// be1's servers stop, every LB node marks be1 DOWN within interval × fall (plus a
// margin), takes it out of the Maglev tables, and new connections avoid it; when they
// start again, be1 is UP again after rise successes and takes new connections. The
// established connections to be2 and be3 are untouched throughout.
func TestHealthCheck(t *testing.T) {
	tb := newLB(t, options{})
	be1 := tb.backends[0]
	type hcService struct {
		name  string
		vip   netip.AddrPort
		check []string
	}
	services := []hcService{
		{"hc-tcp", netip.AddrPortFrom(vipHC, 9100), []string{"--health-check", "tcp"}},
		{"hc-http", netip.AddrPortFrom(vipHC, 9200), []string{"--health-check", "http",
			"--health-check-port", fmt.Sprint(httpPort), "--health-check-path", "/"}},
	}
	for _, s := range services {
		args := []string{"service", "create", s.name, "--vip", vipHC.String(), "--port", fmt.Sprint(s.vip.Port()),
			"--health-check-interval", hcInterval.String(), "--health-check-timeout", hcTimeout.String(),
			"--health-check-rise", fmt.Sprint(hcRise), "--health-check-fall", fmt.Sprint(hcFall)}
		args = append(args, s.check...)
		for _, be := range tb.backends {
			args = append(args, "--backend", netip.AddrPortFrom(be.addr4, echoPort).String())
		}
		tb.lbctlLBs(t, args...)
		for _, be := range tb.backends {
			tb.waitHealth(t, s.name, netip.AddrPortFrom(be.addr4, echoPort), lbdv1.HealthState_HEALTH_STATE_UP, 10*time.Second)
		}
	}
	tb.router.waitNextHops(t, vipHC, tb.lbs, 5*time.Second)
	// One established connection per service, on a backend that stays up.
	streams := []*stream{
		tb.streamOn(t, services[0].vip, tb.backends[1].name),
		tb.streamOn(t, services[1].vip, tb.backends[2].name),
	}
	check := func(when string) {
		t.Helper()
		for _, s := range streams {
			if err := s.progress(20, 5*time.Second); err != nil {
				t.Fatalf("%s: %v", when, err)
			}
		}
	}
	ap1 := netip.AddrPortFrom(be1.addr4, echoPort)

	t.Logf("stop the servers of %s", be1.name)
	start := time.Now()
	be1.servers.Kill()
	for _, s := range services {
		took := time.Since(start) + tb.waitHealth(t, s.name, ap1, lbdv1.HealthState_HEALTH_STATE_DOWN, 10*time.Second)
		t.Logf("%s: %s DOWN and out of the Maglev table on every LB node %v after its servers stopped", s.name, be1.name, took.Round(time.Millisecond))
		if limit := hcInterval*hcFall + hcMargin; took > limit {
			t.Errorf("%s: %s marked DOWN after %v, want within interval × fall + margin = %v", s.name, be1.name, took, limit)
		}
	}
	for _, lb := range tb.lbs {
		svc := lb.lbd.service(t, services[1].name)
		for _, b := range svc.GetBackends() {
			if b.GetAddress() == be1.addr4.String() {
				t.Logf("%s: lbctl service get %s: %s %v, last result %q", lb.name, svc.GetName(), be1.name,
					b.GetHealth().GetState(), b.GetHealth().GetLastResult())
			}
		}
		if got := svc.GetStatus().GetUsableBackends(); got != 2 {
			t.Errorf("%s: %s has %d usable backends with %s down, want 2", lb.name, svc.GetName(), got, be1.name)
		}
	}
	for _, s := range services {
		got := map[string]int{}
		for range 30 {
			got[tb.echoOnce(t, s.vip)]++
		}
		t.Logf("%s: 30 new connections while %s is down: %v", s.name, be1.name, got)
		if got[be1.name] != 0 {
			t.Errorf("%s: %d new connections reached the down %s", s.name, got[be1.name], be1.name)
		}
	}
	check("while be1 is down")

	t.Logf("start the servers of %s again", be1.name)
	tb.startServers(be1)
	start = time.Now()
	for _, s := range services {
		took := time.Since(start) + tb.waitHealth(t, s.name, ap1, lbdv1.HealthState_HEALTH_STATE_UP, 10*time.Second)
		t.Logf("%s: %s UP and back in the Maglev table on every LB node %v after its servers answered again", s.name, be1.name, took.Round(time.Millisecond))
		if limit := hcInterval*hcRise + hcMargin; took > limit {
			t.Errorf("%s: %s marked UP after %v, want within interval × rise + margin = %v", s.name, be1.name, took, limit)
		}
	}
	for _, s := range services {
		got := map[string]int{}
		for range 45 {
			got[tb.echoOnce(t, s.vip)]++
		}
		t.Logf("%s: 45 new connections after %s came back: %v", s.name, be1.name, got)
		// An equal share is 15; 4 is three standard deviations below it.
		if got[be1.name] < 4 {
			t.Errorf("%s: %d of 45 new connections reached %s after it came back", s.name, got[be1.name], be1.name)
		}
	}
	check("after be1 came back")
}
