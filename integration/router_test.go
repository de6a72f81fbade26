//go:build linux

package integration

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/testnet"
)

// BGP between the router and the LB nodes: every LB node's lbd peers with BIRD over
// the IPv4 fabric (one session carries both families), eBGP from one AS for all LB
// nodes, so that BIRD merges their routes into one ECMP route.
const (
	routerAS = 65000
	lbAS     = 65010
	// Short timers: a session whose speaker vanished is dropped within seconds, and
	// a reconnect is not held back by BIRD's default error wait of a minute.
	bgpHold      = 3 * time.Second
	bgpKeepalive = time.Second
)

// bird is the router: BIRD 2 in the router namespace, exporting its routes to the
// kernel, which spreads each VIP over its next hops by ECMP. The routes come from one
// BGP session per LB node (protocol named after the node), or, for a testbed without
// lbd (options.staticRoutes), from static routes over every LB node.
type bird struct {
	tb         *testbed
	conf, sock string
	proc       *testnet.Proc
	static     bool
	// nextHops are the LB nodes the router takes routes from: the enabled sessions,
	// or the gateways of the static routes.
	nextHops []*node
	// watched are the VIPs whose routes waitRoutes checks.
	watched []netip.Addr
}

// routedVIPs are the VIPs the static routes send to the LB nodes.
var routedVIPs = []netip.Addr{vip4, vip6}

// startRouter starts BIRD. With static routes it waits for them; with BGP the routes
// come once the LB daemons run (startLBD waits for them).
func (tb *testbed) startRouter(lbs []*node) *bird {
	t := tb.t
	r := &bird{
		tb:      tb,
		conf:    filepath.Join(tb.dir, "bird.conf"),
		sock:    filepath.Join(tb.dir, "bird.ctl"),
		static:  tb.opts.staticRoutes,
		watched: []netip.Addr{vip4},
	}
	if r.static {
		r.watched = routedVIPs
	}
	r.write(t, lbs)
	r.proc = tb.spawn("bird", tb.routerNS, nil, "bird", "-f", "-c", r.conf, "-s", r.sock,
		"-P", filepath.Join(tb.dir, "bird.pid"))
	if r.static {
		r.waitRoutes(t)
	} else {
		// birdc fails until BIRD opened its control socket.
		eventually(t, 10*time.Second, func() error {
			_, err := r.birdc("show", "status")
			return err
		})
	}
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
	if !r.static {
		for _, lb := range r.tb.lbs {
			// passive: lbd only connects out (listen_port 0). BIRD is a graceful
			// restart helper by default ("aware"): it keeps the routes of a speaker
			// that announced graceful restart while that speaker restarts.
			fmt.Fprintf(&b, "protocol bgp %s {\n", lb.name)
			fmt.Fprintf(&b, "\tlocal %s as %d;\n\tneighbor %s as %d;\n", routerFabric4, routerAS, lb.addr4, lbAS)
			fmt.Fprintf(&b, "\tpassive on;\n\thold time %d;\n\tkeepalive time %d;\n",
				int(bgpHold.Seconds()), int(bgpKeepalive.Seconds()))
			b.WriteString("\terror wait time 1, 2;\n")
			b.WriteString("\tipv4 { import all; export none; };\n\tipv6 { import all; export none; };\n}\n")
		}
	} else {
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
	}
	if err := os.WriteFile(r.conf, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

// birdc runs one command on the router's control socket.
func (r *bird) birdc(args ...string) (string, error) {
	return testnet.Output(exec.Command("birdc", append([]string{"-s", r.sock}, args...)...))
}

// setNextHops makes the router spread the VIPs over lbs only, and waits until the
// kernel's routes say so. With BGP it disables the sessions of the other LB nodes (a
// router operator shutting a neighbor down) and enables those of lbs.
func (r *bird) setNextHops(t *testing.T, lbs ...*node) {
	t.Helper()
	if r.static {
		r.write(t, lbs)
		if out, err := r.birdc("configure"); err != nil || !strings.Contains(out, "Reconfigured") {
			t.Fatalf("birdc configure: %v: %s", err, out)
		}
	} else {
		for _, lb := range r.tb.lbs {
			was, is := slices.Contains(r.nextHops, lb), slices.Contains(lbs, lb)
			if was == is {
				continue
			}
			cmd := "disable"
			if is {
				cmd = "enable"
			}
			if out, err := r.birdc(cmd, lb.name); err != nil || !strings.Contains(out, lb.name+": "+cmd+"d") {
				t.Fatalf("birdc %s %s: %v: %s", cmd, lb.name, err, out)
			}
		}
		r.nextHops = lbs
	}
	r.waitRoutes(t)
}

// waitRoutes waits until the kernel route of every watched VIP has exactly the
// router's next hops.
func (r *bird) waitRoutes(t *testing.T) {
	t.Helper()
	for _, vip := range r.watched {
		r.waitNextHops(t, vip, r.nextHops, 15*time.Second)
	}
}

// gateways returns the sorted next-hop addresses of lbs for a VIP's family.
func gateways(vip netip.Addr, lbs []*node) []string {
	out := []string{}
	for _, lb := range lbs {
		if vip.Is4() {
			out = append(out, lb.addr4.String())
		} else {
			out = append(out, lb.addr6.String())
		}
	}
	slices.Sort(out)
	return out
}

// waitNextHops waits until the router's kernel route to vip goes exactly via lbs (no
// route at all for none) and returns how long that took, polling every 20 ms.
func (r *bird) waitNextHops(t *testing.T, vip netip.Addr, lbs []*node, timeout time.Duration) time.Duration {
	t.Helper()
	want := gateways(vip, lbs)
	start := time.Now()
	for {
		got, err := kernelNextHops(r.tb.routerNS, vip)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Equal(got, want) {
			return time.Since(start)
		}
		if !r.proc.Running() || time.Since(start) > timeout {
			out, _ := r.birdc("show", "protocols")
			t.Fatalf("router route to %s via %v after %v, want %v; BIRD protocols:\n%s", vip, got, timeout, want, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kernelNextHops returns the sorted gateways of the kernel route to vip in ns, an
// empty list if there is none.
func kernelNextHops(ns *testnet.NS, vip netip.Addr) ([]string, error) {
	fam := "-4"
	if vip.Is6() {
		fam = "-6"
	}
	out, err := testnet.Output(exec.Command("ip", "-n", ns.Name, "-j", fam, "route", "show", netip.PrefixFrom(vip, vip.BitLen()).String()))
	if err != nil {
		return nil, err
	}
	gws := []string{}
	if strings.TrimSpace(out) == "" {
		return gws, nil
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
