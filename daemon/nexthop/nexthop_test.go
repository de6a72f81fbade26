//go:build linux

package nexthop

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/testnet"
)

// TestColdStart: with no neighbour entry at all, as on a freshly booted host, the
// tracker creates managed entries that the kernel resolves, IPv4 and IPv6, and
// records them.
func TestColdStart(t *testing.T) {
	d := newDirect(t)
	for _, n := range []netip.Addr{node4, node6} {
		if line := neigh(t, d.lb, d.lbIf, n); line != "" {
			t.Fatalf("entry before the tracker ran: %s", line)
		}
	}
	rec := filepath.Join(t.TempDir(), "neighbours.json")
	tr := startTracker(t, d.lb, Options{RecordPath: rec}, node4, node6)
	ifindex := d.lb.Interface(t, d.lbIf).Index
	for _, c := range []struct {
		node, src netip.Addr
	}{{node4, lbAddr4.Addr()}, {node6, lbAddr6.Addr()}} {
		p, took := waitPath(t, tr.Tracker, c.node, 5*time.Second, "managed and REACHABLE", managedReachable)
		t.Logf("%s: %s after %v", c.node, p.Reason, took)
		want := Path{Node: c.node, Reachable: true, NextHop: c.node, Interface: d.lbIf, Ifindex: ifindex, Source: c.src,
			Neighbour: "REACHABLE", Managed: true,
			Reason: "on-link dev " + d.lbIf + " src " + c.src.String() + ", neighbour REACHABLE (managed)"}
		if p != want {
			t.Errorf("path\n got %+v\nwant %+v", p, want)
		}
		if line := neigh(t, d.lb, d.lbIf, c.node); !isManagedLine(line) || !strings.HasSuffix(line, "REACHABLE") {
			t.Errorf("kernel entry: %q", line)
		}
	}
	want := []string{d.lbIf + " " + node4.String(), d.lbIf + " " + node6.String()}
	if got := recorded(t, rec); !slices.Equal(got, want) {
		t.Errorf("record %v, want %v", got, want)
	}
	n, last := tr.onChanges()
	if n == 0 || last[node4] != tr.Paths()[node4] {
		t.Errorf("OnChange: %d calls, last %+v", n, last)
	}
}

// gateway is LB – router – backend: the backend node is two hops away.
type gateway struct {
	lb, router, be *testnet.NS
	lbIf           string
	gw, node       netip.Addr
}

func newGateway(t *testing.T) *gateway {
	s := testnet.Suffix(t)
	g := &gateway{lbIf: "l-" + s, gw: netip.MustParseAddr("198.18.1.1"), node: netip.MustParseAddr("198.18.2.22")}
	g.lb = testnet.NewNS(t, "nhlb-"+s)
	g.router = testnet.NewNS(t, "nhrt-"+s)
	g.be = testnet.NewNS(t, "nhbe-"+s)
	testnet.Veth(t, testnet.VethEnd{NS: g.lb, Name: g.lbIf}, testnet.VethEnd{NS: g.router, Name: "rl-" + s})
	testnet.Veth(t, testnet.VethEnd{NS: g.router, Name: "rb-" + s}, testnet.VethEnd{NS: g.be, Name: "b-" + s})
	g.lb.AddAddr(t, g.lbIf, netip.MustParsePrefix("198.18.1.11/24"))
	g.router.AddAddr(t, "rl-"+s, netip.MustParsePrefix("198.18.1.1/24"))
	g.router.AddAddr(t, "rb-"+s, netip.MustParsePrefix("198.18.2.1/24"))
	g.be.AddAddr(t, "b-"+s, netip.MustParsePrefix("198.18.2.22/24"))
	g.router.Sysctl(t, "net.ipv4.ip_forward=1")
	g.be.IP(t, "route add default via 198.18.2.1")
	g.lb.IP(t, "route add 198.18.2.0/24 via 198.18.1.1")
	g.lb.WaitUp(t, g.lbIf)
	return g
}

// TestGatewayRoute: the next hop is the gateway; a route deleted makes the node
// unreachable within a second (and frees the gateway's entry), a route back makes it
// reachable again within a second; unreachable, blackhole and prohibit routes say so.
func TestGatewayRoute(t *testing.T) {
	g := newGateway(t)
	tr := startTracker(t, g.lb, Options{}, g.node)
	p, took := waitPath(t, tr.Tracker, g.node, 5*time.Second, "managed and REACHABLE", managedReachable)
	t.Logf("cold: %s after %v", p.Reason, took)
	if p.NextHop != g.gw || p.Interface != g.lbIf || p.Source != netip.MustParseAddr("198.18.1.11") {
		t.Errorf("path %+v, want next hop %s dev %s src 198.18.1.11", p, g.gw, g.lbIf)
	}
	if !strings.HasPrefix(p.Reason, "via 198.18.1.1 dev "+g.lbIf+" src 198.18.1.11") {
		t.Errorf("reason %q", p.Reason)
	}
	if line := neigh(t, g.lb, g.lbIf, g.node); line != "" {
		t.Errorf("an entry for the node itself, which is not on-link: %s", line)
	}

	changes, _ := tr.onChanges()
	start := time.Now()
	g.lb.IP(t, "route del 198.18.2.0/24")
	p, took = waitPathSince(t, start, tr.Tracker, g.node, 5*time.Second, "unreachable", func(p Path) bool { return !p.Reachable })
	t.Logf("route deleted: %q after %v", p.Reason, took)
	if took > time.Second || p.Reason != "no route to backend node 198.18.2.22" || p.NextHop.IsValid() || p.Interface != "" {
		t.Errorf("after the route went (%v): %+v", took, p)
	}
	if n, last := tr.onChanges(); n <= changes || last[g.node].Reachable {
		t.Errorf("OnChange not told: %d calls (before %d), last %+v", n, changes, last[g.node])
	}
	waitNeigh(t, g.lb, g.lbIf, g.gw, time.Second, "deleted (no node needs it)", func(l string) bool { return l == "" })

	start = time.Now()
	g.lb.IP(t, "route add 198.18.2.0/24 via 198.18.1.1")
	p, took = waitPathSince(t, start, tr.Tracker, g.node, 5*time.Second, "reachable", func(p Path) bool { return p.Reachable })
	t.Logf("route back: %q after %v", p.Reason, took)
	if took > time.Second || p.NextHop != g.gw {
		t.Errorf("after the route came back (%v): %+v", took, p)
	}

	for _, c := range []struct{ kind, reason string }{
		{"unreachable", "no route to backend node 198.18.2.22 (unreachable route)"},
		{"blackhole", "no route to backend node 198.18.2.22 (blackhole route)"},
		{"prohibit", "no route to backend node 198.18.2.22 (prohibit route)"},
	} {
		start = time.Now()
		g.lb.IP(t, "route replace "+c.kind+" 198.18.2.0/24")
		p, took = waitPathSince(t, start, tr.Tracker, g.node, 5*time.Second, c.kind, func(p Path) bool { return p.Reason == c.reason })
		if took > time.Second || p.Reachable {
			t.Errorf("%s route (%v): %+v", c.kind, took, p)
		}
	}
}

// TestIPv4ViaIPv6: an IPv4 route via an IPv6 next hop (RFC 5549, as BGP unnumbered
// installs) has that next hop managed, not an ARP entry for the node.
func TestIPv4ViaIPv6(t *testing.T) {
	d := newDirect(t)
	ll := d.be.Exec(t, "ip", "-6", "-o", "addr", "show", "dev", d.beIf, "scope", "link")
	f := strings.Fields(ll) // "3: b-x inet6 fe80::…/64 scope link …"
	if len(f) < 4 {
		t.Fatalf("backend link-local address: %q", ll)
	}
	gw := netip.MustParsePrefix(f[3]).Addr()
	node := netip.MustParseAddr("198.18.9.9")
	d.lb.IP(t, "route add 198.18.9.0/24 via inet6 "+gw.String()+" dev "+d.lbIf)
	tr := startTracker(t, d.lb, Options{}, node)
	p, _ := waitPath(t, tr.Tracker, node, 5*time.Second, "managed and REACHABLE", managedReachable)
	if p.NextHop != gw || p.Interface != d.lbIf || !strings.HasPrefix(p.Reason, "via "+gw.String()+" dev "+d.lbIf) {
		t.Errorf("path %+v, want next hop %s", p, gw)
	}
	if line := neigh(t, d.lb, d.lbIf, gw); !isManagedLine(line) {
		t.Errorf("next hop's entry: %q", line)
	}
}

// TestInterfaceDown: the backend's interface going down takes the LB side's carrier
// (and the kernel flushes its entries): unreachable at once, reachable again when up.
func TestInterfaceDown(t *testing.T) {
	d := newDirect(t)
	tr := startTracker(t, d.lb, Options{}, node4)
	waitPath(t, tr.Tracker, node4, 5*time.Second, "managed and REACHABLE", managedReachable)

	start := time.Now()
	d.be.IP(t, "link set "+d.beIf+" down")
	p, took := waitPathSince(t, start, tr.Tracker, node4, 5*time.Second, "unreachable", func(p Path) bool { return !p.Reachable })
	t.Logf("down: %q after %v", p.Reason, took)
	if took > time.Second || p.Reason != "interface "+d.lbIf+" toward next hop "+node4.String()+" has no carrier" {
		t.Errorf("after the backend's interface went down (%v): %+v", took, p)
	}

	start = time.Now()
	d.be.IP(t, "link set "+d.beIf+" up")
	p, took = waitPathSince(t, start, tr.Tracker, node4, 5*time.Second, "managed and REACHABLE", managedReachable)
	t.Logf("up: %q after %v", p.Reason, took)
}

// TestNeighbourFails: a backend node that stops answering (its address gone, the link
// still up) makes the kernel fail the managed entry: the node becomes unreachable and
// stays so while the kernel re-probes (INCOMPLETE in between), and becomes reachable
// when it answers again. The LB side's neighbour timers are shortened; with the
// defaults the failure takes up to a minute (reachable time 15–45 s, then the kernel's
// managed-entry work, every 5 s, moves the STALE entry to DELAY for 5 s, then 3 probes
// 1 s apart). That work's 5 s period is the table-wide interval_probe_time_ms, which
// a namespace cannot change (the per-interface one is not used): it bounds detection
// and recovery.
func TestNeighbourFails(t *testing.T) {
	d := newDirect(t)
	dir := "net.ipv4.neigh." + d.lbIf + "."
	d.lb.Sysctl(t, dir+"base_reachable_time_ms=500", dir+"delay_first_probe_time=1", dir+"retrans_time_ms=200",
		dir+"ucast_solicit=2", dir+"mcast_solicit=2")
	// A short Resync reads the entry during the re-probes too, which must not count.
	tr := startTracker(t, d.lb, Options{Resync: 100 * time.Millisecond}, node4)
	waitPath(t, tr.Tracker, node4, 5*time.Second, "managed and REACHABLE", managedReachable)

	start := time.Now()
	d.be.IP(t, "addr del "+node4.String()+"/24 dev "+d.beIf)
	p, took := waitPathSince(t, start, tr.Tracker, node4, 15*time.Second, "unreachable", func(p Path) bool { return !p.Reachable })
	t.Logf("stopped answering: %q after %v", p.Reason, took)
	if p.Reason != "next hop "+node4.String()+" dev "+d.lbIf+" does not answer (neighbour FAILED)" || !p.Managed {
		t.Errorf("path %+v", p)
	}
	states := map[string]bool{}
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		p := tr.Paths()[node4]
		states[p.Neighbour] = true
		if p.Reachable {
			t.Fatalf("reachable again while the node does not answer: %+v", p)
		}
	}
	t.Logf("states seen while failed: %v", states)

	start = time.Now()
	d.be.AddAddr(t, d.beIf, netip.PrefixFrom(node4, 24))
	p, took = waitPathSince(t, start, tr.Tracker, node4, 15*time.Second, "managed and REACHABLE", managedReachable)
	t.Logf("answers again: %q after %v", p.Reason, took)
}

// TestOthersEntriesLeftAlone: a PERMANENT entry and a managed entry someone else
// created are used as they are, and neither Run nor Release touches them.
func TestOthersEntriesLeftAlone(t *testing.T) {
	d := newDirect(t)
	mac := d.be.Interface(t, d.beIf).HardwareAddr
	d.lb.IP(t, "neigh add "+node4.String()+" dev "+d.lbIf+" lladdr "+mac.String()+" nud permanent",
		"neigh add "+node6.String()+" dev "+d.lbIf+" managed")
	before4 := neigh(t, d.lb, d.lbIf, node4)
	rec := filepath.Join(t.TempDir(), "neighbours.json")
	tr := startTracker(t, d.lb, Options{RecordPath: rec}, node4, node6)

	p, _ := waitPath(t, tr.Tracker, node4, 5*time.Second, "reachable", func(p Path) bool { return p.Reachable })
	if p.Managed || p.Neighbour != "PERMANENT" || !strings.HasSuffix(p.Reason, ", neighbour PERMANENT") {
		t.Errorf("permanent entry's path: %+v", p)
	}
	p, _ = waitPath(t, tr.Tracker, node6, 5*time.Second, "REACHABLE", func(p Path) bool { return p.Neighbour == "REACHABLE" })
	if p.Managed || !p.Reachable || !strings.HasSuffix(p.Reason, "(managed by another owner)") {
		t.Errorf("another owner's managed entry's path: %+v", p)
	}
	tr.stop()
	if err := tr.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := neigh(t, d.lb, d.lbIf, node4); got != before4 || !strings.HasSuffix(got, "PERMANENT") {
		t.Errorf("permanent entry changed: %q, was %q", got, before4)
	}
	if got := neigh(t, d.lb, d.lbIf, node6); !isManagedLine(got) {
		t.Errorf("another owner's managed entry gone or changed: %q", got)
	}
	if got := recorded(t, rec); got != nil {
		t.Errorf("record: %v", got)
	}
}

// TestRelease: a dynamic entry the kernel learned is turned into a managed one and
// becomes the tracker's. A tracker that never ran, made from the record (as a
// detaching daemon does), deletes it and the one the first tracker created with
// Release, and removes the record.
func TestRelease(t *testing.T) {
	d := newDirect(t)
	mac := d.be.Interface(t, d.beIf).HardwareAddr
	d.lb.IP(t, "neigh add "+node4.String()+" dev "+d.lbIf+" lladdr "+mac.String()+" nud stale")
	rec := filepath.Join(t.TempDir(), "neighbours.json")
	tr := startTracker(t, d.lb, Options{RecordPath: rec}, node4, node6)
	// The converted STALE entry spends delay_first_probe_time (5 s) in DELAY first.
	waitPath(t, tr.Tracker, node4, 5*time.Second, "managed", func(p Path) bool { return p.Reachable && p.Managed })
	waitPath(t, tr.Tracker, node6, 5*time.Second, "managed and REACHABLE", managedReachable)
	if line := neigh(t, d.lb, d.lbIf, node4); !isManagedLine(line) {
		t.Errorf("learned entry not converted: %q", line)
	}
	if got := recorded(t, rec); len(got) != 2 {
		t.Errorf("record: %v", got)
	}
	tr.stop()
	var detach *Tracker
	var err error
	d.lb.Do(t, func() { detach, err = New(Options{RecordPath: rec}) })
	if err != nil {
		t.Fatal(err)
	}
	if err := detach.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, n := range []netip.Addr{node4, node6} {
		if got := neigh(t, d.lb, d.lbIf, n); got != "" {
			t.Errorf("entry left after Release: %q", got)
		}
	}
	if _, err := os.Stat(rec); !os.IsNotExist(err) {
		t.Errorf("record left after Release: %v", err)
	}
}

// TestSetNodesRemoves: a node taken out of the set loses its path and the managed
// entry the tracker created for it.
func TestSetNodesRemoves(t *testing.T) {
	d := newDirect(t)
	rec := filepath.Join(t.TempDir(), "neighbours.json")
	tr := startTracker(t, d.lb, Options{RecordPath: rec}, node4, node4b)
	waitPath(t, tr.Tracker, node4, 5*time.Second, "managed and REACHABLE", managedReachable)
	waitPath(t, tr.Tracker, node4b, 5*time.Second, "managed and REACHABLE", managedReachable)

	tr.SetNodes([]netip.Addr{node4})
	for start := time.Now(); len(tr.Paths()) != 1; time.Sleep(5 * time.Millisecond) {
		if time.Since(start) > time.Second {
			t.Fatalf("the removed node's path still there after 1 s: %+v", tr.Paths())
		}
	}
	if line := neigh(t, d.lb, d.lbIf, node4b); line != "" {
		t.Errorf("the removed node's entry: %q", line)
	}
	if _, last := tr.onChanges(); len(last) != 1 {
		t.Errorf("OnChange's last paths: %+v", last)
	}
	if line := neigh(t, d.lb, d.lbIf, node4); !isManagedLine(line) {
		t.Errorf("the remaining node's entry: %q", line)
	}
	if got := recorded(t, rec); !slices.Equal(got, []string{d.lbIf + " " + node4.String()}) {
		t.Errorf("record: %v", got)
	}
}

// TestRestartAdopts: a second tracker with the same record (a restarted daemon)
// adopts the first one's entries, keeps them until it knows its nodes, then deletes
// the one no node needs and keeps the other as its own.
func TestRestartAdopts(t *testing.T) {
	d := newDirect(t)
	rec := filepath.Join(t.TempDir(), "neighbours.json")
	first := startTracker(t, d.lb, Options{RecordPath: rec}, node4, node4b)
	waitPath(t, first.Tracker, node4, 5*time.Second, "managed and REACHABLE", managedReachable)
	waitPath(t, first.Tracker, node4b, 5*time.Second, "managed and REACHABLE", managedReachable)
	first.stop()

	second := startTracker(t, d.lb, Options{RecordPath: rec})
	time.Sleep(200 * time.Millisecond) // Run resolves with no nodes known yet
	for _, n := range []netip.Addr{node4, node4b} {
		if line := neigh(t, d.lb, d.lbIf, n); !isManagedLine(line) {
			t.Errorf("entry of %s before the nodes are known: %q", n, line)
		}
	}
	second.SetNodes([]netip.Addr{node4})
	waitNeigh(t, d.lb, d.lbIf, node4b, time.Second, "deleted", func(l string) bool { return l == "" })
	p, _ := waitPath(t, second.Tracker, node4, time.Second, "managed and REACHABLE", managedReachable)
	if !strings.HasSuffix(p.Reason, "(managed)") {
		t.Errorf("adopted entry's path: %+v", p)
	}
	if got := recorded(t, rec); !slices.Equal(got, []string{d.lbIf + " " + node4.String()}) {
		t.Errorf("record: %v", got)
	}
	second.stop()
	if err := second.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if line := neigh(t, d.lb, d.lbIf, node4); line != "" {
		t.Errorf("adopted entry left after Release: %q", line)
	}
}

// TestWithoutManaged: as on a kernel without managed entries (forced here), the
// tracker still computes paths, and has the kernel resolve a missing next hop.
func TestWithoutManaged(t *testing.T) {
	d := newDirect(t)
	rec := filepath.Join(t.TempDir(), "neighbours.json")
	var tr *Tracker
	var err error
	d.lb.Do(t, func() { tr, err = New(Options{RecordPath: rec}) })
	if err != nil {
		t.Fatal(err)
	}
	tr.noManaged = true
	tr.SetNodes([]netip.Addr{node4})
	runTracker(t, tr)
	p, took := waitPath(t, tr, node4, 5*time.Second, "REACHABLE", func(p Path) bool { return p.Neighbour == "REACHABLE" })
	t.Logf("%q after %v", p.Reason, took)
	if !p.Reachable || p.Managed {
		t.Errorf("path %+v", p)
	}
	if line := neigh(t, d.lb, d.lbIf, node4); isManagedLine(line) {
		t.Errorf("a managed entry although managed entries are off: %q", line)
	}
	if got := recorded(t, rec); got != nil {
		t.Errorf("record: %v", got)
	}
}

// TestRunLeavesNothing: once Run returned, none of its goroutines and sockets remain.
func TestRunLeavesNothing(t *testing.T) {
	d := newDirect(t)
	before := sockets(t)
	tr := startTracker(t, d.lb, Options{}, node4)
	waitPath(t, tr.Tracker, node4, 5*time.Second, "managed and REACHABLE", managedReachable)
	if sockets(t) <= before {
		t.Fatalf("no socket open while Run runs: the count proves nothing")
	}
	tr.stop()
	deadline := time.Now().Add(2 * time.Second)
	for {
		left := leftovers()
		n := sockets(t)
		if left == "" && n == before {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after Run returned: %d sockets (%d before)\n%s", n, before, left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sockets counts the process's open sockets.
func sockets(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

// leftovers returns the stacks of goroutines in the tracker or the netlink library.
func leftovers() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "vishvananda/netlink") || strings.Contains(g, "nexthop.(*Tracker)") || strings.Contains(g, "nexthop.watch") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}
