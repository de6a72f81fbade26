//go:build linux

package nexthop

import (
	"context"
	"encoding/json"
	"maps"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/internal/testnet"
)

var (
	lbAddr4 = netip.MustParsePrefix("198.18.0.11/24")
	lbAddr6 = netip.MustParsePrefix("2001:db8::11/64")
	node4   = netip.MustParseAddr("198.18.0.22")
	node4b  = netip.MustParseAddr("198.18.0.23")
	node6   = netip.MustParseAddr("2001:db8::22")
)

// direct is an LB namespace and a backend namespace on one veth: every node is
// on-link. No neighbour entry exists until someone resolves one.
type direct struct {
	lb, be     *testnet.NS
	lbIf, beIf string
}

func newDirect(t *testing.T) *direct {
	s := testnet.Suffix(t)
	d := &direct{lbIf: "l-" + s, beIf: "b-" + s}
	d.lb = testnet.NewNS(t, "nhlb-"+s)
	d.be = testnet.NewNS(t, "nhbe-"+s)
	// The kernel sends a managed entry's neighbour solicitations from the interface's
	// link-local address, so none leaves while that address is tentative (about 2 s
	// after the link comes up), and a tentative address answers none: both sides skip
	// the detection.
	d.lb.Sysctl(t, "net.ipv6.conf.default.accept_dad=0")
	d.be.Sysctl(t, "net.ipv6.conf.default.accept_dad=0")
	testnet.Veth(t, testnet.VethEnd{NS: d.lb, Name: d.lbIf}, testnet.VethEnd{NS: d.be, Name: d.beIf})
	d.lb.AddAddr(t, d.lbIf, lbAddr4, lbAddr6)
	d.be.AddAddr(t, d.beIf, netip.PrefixFrom(node4, 24), netip.PrefixFrom(node4b, 24), netip.PrefixFrom(node6, 64))
	d.lb.WaitUp(t, d.lbIf)
	d.be.WaitUp(t, d.beIf)
	return d
}

// tracker is a Tracker whose Run goroutine the test stops at cleanup (before the
// namespaces go), and which counts OnChange calls.
type tracker struct {
	*Tracker
	mu      sync.Mutex
	changes int
	last    map[netip.Addr]Path
	stop    func()
}

// startTracker creates a Tracker inside ns, sets its nodes and runs it from a
// goroutine outside the namespace, as the daemon's wiring may.
func startTracker(t *testing.T, ns *testnet.NS, opts Options, nodes ...netip.Addr) *tracker {
	t.Helper()
	tr := &tracker{}
	if opts.Logger == nil {
		opts.Logger = hclog.New(&hclog.LoggerOptions{Name: "nexthop", Output: testWriter{t}, Level: hclog.Debug})
	}
	opts.OnChange = func(paths map[netip.Addr]Path) {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		tr.changes++
		tr.last = paths
	}
	var err error
	ns.Do(t, func() { tr.Tracker, err = New(opts) })
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if nodes != nil {
		tr.SetNodes(nodes)
	}
	tr.stop = runTracker(t, tr.Tracker)
	return tr
}

// runTracker runs tr until the returned stop (also a cleanup) is called.
func runTracker(t *testing.T, tr *Tracker) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tr.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Errorf("Run did not return 5 s after its context ended")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func (tr *tracker) onChanges() (int, map[netip.Addr]Path) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.changes, maps.Clone(tr.last)
}

// waitPath waits until node's path satisfies ok and returns it with the time it took.
func waitPath(t *testing.T, tr *Tracker, node netip.Addr, timeout time.Duration, what string, ok func(Path) bool) (Path, time.Duration) {
	t.Helper()
	return waitPathSince(t, time.Now(), tr, node, timeout, what, ok)
}

// waitPathSince is waitPath counting from start, the moment of the change the test
// made: the command that made it takes time too.
func waitPathSince(t *testing.T, start time.Time, tr *Tracker, node netip.Addr, timeout time.Duration, what string, ok func(Path) bool) (Path, time.Duration) {
	t.Helper()
	for {
		p, found := tr.Paths()[node]
		if found && ok(p) {
			return p, time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("path to %s not %s after %v: %+v (found %v)", node, what, timeout, p, found)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func managedReachable(p Path) bool {
	return p.Reachable && p.Managed && p.Neighbour == "REACHABLE"
}

// neigh returns `ip -d neigh` for addr on dev in ns, "" when there is no entry.
func neigh(t *testing.T, ns *testnet.NS, dev string, addr netip.Addr) string {
	t.Helper()
	out := testnet.Run(t, "ip", "-n", ns.Name, "-d", "neigh", "show", "to", addr.String(), "dev", dev)
	return strings.TrimSpace(out)
}

// waitNeigh waits until the entry's `ip -d neigh` line satisfies ok.
func waitNeigh(t *testing.T, ns *testnet.NS, dev string, addr netip.Addr, timeout time.Duration, what string, ok func(string) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		line := neigh(t, ns, dev, addr)
		if ok(line) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("neighbour %s dev %s not %s after %v: %q", addr, dev, what, timeout, line)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func isManagedLine(line string) bool { return strings.Contains(line, " managed ") }

// recorded returns the record file's entries as "interface address" strings.
func recorded(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("record %s: %v\n%s", path, err, b)
	}
	var out []string
	for _, e := range r.Entries {
		out = append(out, e.Interface+" "+e.Address.String())
	}
	return out
}

// testWriter sends the tracker's logs to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
