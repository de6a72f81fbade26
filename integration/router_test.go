//go:build linux

package integration

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// bird is the router: BIRD 2 in the router namespace, exporting its routes to the
// kernel, which spreads each VIP over its next hops by ECMP. Today the VIP routes are
// static; with BGP, the static protocols give way to one bgp protocol per LB node and
// setNextHops to the LB daemons announcing or withdrawing.
type bird struct {
	tb         *testbed
	conf, sock string
	proc       *proc
	nextHops   []*node
}

// routedVIPs are the VIPs the router sends to the LB nodes.
var routedVIPs = []netip.Addr{vip4, vip6}

func (tb *testbed) startRouter(lbs []*node) *bird {
	t := tb.t
	r := &bird{
		tb:   tb,
		conf: filepath.Join(tb.dir, "bird.conf"),
		sock: filepath.Join(tb.dir, "bird.ctl"),
	}
	r.write(t, lbs)
	r.proc = tb.spawn("bird", tb.routerNS, nil, "bird", "-f", "-c", r.conf, "-s", r.sock,
		"-P", filepath.Join(tb.dir, "bird.pid"))
	r.waitRoutes(t)
	return r
}

// write renders the configuration for the given next hops.
func (r *bird) write(t *testing.T, lbs []*node) {
	t.Helper()
	r.nextHops = lbs
	var b strings.Builder
	fmt.Fprintf(&b, "log stderr all;\nrouter id %s;\n", routerFabric4)
	b.WriteString("protocol device {}\n")
	// merge paths: routes for one prefix from several protocols (BGP sessions)
	// become one multipath kernel route.
	b.WriteString("protocol kernel { ipv4 { export all; }; merge paths on; }\n")
	b.WriteString("protocol kernel { ipv6 { export all; }; merge paths on; }\n")
	for _, fam := range []struct {
		name string
		v6   bool
	}{{"ipv4", false}, {"ipv6", true}} {
		fmt.Fprintf(&b, "protocol static vips_%s {\n\t%s;\n", fam.name, fam.name)
		for _, vip := range routedVIPs {
			if vip.Is6() != fam.v6 || len(lbs) == 0 {
				continue
			}
			fmt.Fprintf(&b, "\troute %s", netip.PrefixFrom(vip, vip.BitLen()))
			for _, lb := range lbs {
				nh := lb.addr4
				if fam.v6 {
					nh = lb.addr6
				}
				fmt.Fprintf(&b, " via %s", nh)
			}
			b.WriteString(";\n")
		}
		b.WriteString("}\n")
	}
	if err := os.WriteFile(r.conf, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

// setNextHops makes the router spread the VIPs over lbs only, and waits until the
// kernel's routes say so.
func (r *bird) setNextHops(t *testing.T, lbs ...*node) {
	t.Helper()
	r.write(t, lbs)
	if out, err := runErr("birdc", "-s", r.sock, "configure"); err != nil || !strings.Contains(out, "Reconfigured") {
		t.Fatalf("birdc configure: %v: %s", err, out)
	}
	r.waitRoutes(t)
}

// waitRoutes waits until the kernel route of every VIP has exactly the next hops of
// the configuration.
func (r *bird) waitRoutes(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var diffs []string
		for _, vip := range routedVIPs {
			var want []string
			for _, lb := range r.nextHops {
				if vip.Is4() {
					want = append(want, lb.addr4.String())
				} else {
					want = append(want, lb.addr6.String())
				}
			}
			slices.Sort(want)
			got, err := kernelNextHops(r.tb.routerNS, vip)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				diffs = append(diffs, fmt.Sprintf("%s via %v, want %v", vip, got, want))
			}
		}
		if len(diffs) == 0 {
			return
		}
		if !r.proc.running() || time.Now().After(deadline) {
			t.Fatalf("router routes: %s", strings.Join(diffs, "; "))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kernelNextHops returns the sorted gateways of the kernel route to vip in ns.
func kernelNextHops(ns string, vip netip.Addr) ([]string, error) {
	fam := "-4"
	if vip.Is6() {
		fam = "-6"
	}
	out, err := runErr("ip", "-n", ns, "-j", fam, "route", "show", netip.PrefixFrom(vip, vip.BitLen()).String())
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(out) == "" {
		return nil, nil
	}
	var routes []struct {
		Gateway  string `json:"gateway"`
		NextHops []struct {
			Gateway string `json:"gateway"`
		} `json:"nexthops"`
	}
	if err := json.Unmarshal([]byte(out), &routes); err != nil {
		return nil, fmt.Errorf("parse routes of %s: %w: %s", vip, err, out)
	}
	var gws []string
	for _, r := range routes {
		if r.Gateway != "" {
			gws = append(gws, r.Gateway)
		}
		for _, nh := range r.NextHops {
			gws = append(gws, nh.Gateway)
		}
	}
	slices.Sort(gws)
	return gws, nil
}
