//go:build linux

package integration

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/docs/docstest"
	"github.com/lbd-dev/lbd/internal/testnet"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// docsCommandTimeout bounds one documented command; each returns within seconds.
const docsCommandTimeout = time.Minute

// TestDocs runs every `sh testbed:WHERE` block of README.md and docs/, extracted by
// docstest, in one testbed: the files in docstest.Load's order (deploying before
// operating), the blocks of a file in document order, each command on the node(s) its
// block names. Later commands build on earlier ones (the guide creates the service web
// that the operations guide drains), as for an operator following the guides, so a
// file stops at its first failing command. The docstest package checks that every
// other command is run there, syntax-checked, or in a `sh no-test REASON` block.
func TestDocs(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := docstest.Load(root)
	if err != nil {
		t.Fatalf("extract the documented commands: %v", err)
	}
	var files, tools []string
	byFile := map[string][]docstest.Block{}
	for _, b := range blocks {
		if b.Testbed == "" {
			continue
		}
		if _, seen := byFile[b.File]; !seen {
			files = append(files, b.File)
		}
		byFile[b.File] = append(byFile[b.File], b)
		for _, c := range b.Commands {
			if prog := strings.Fields(docstest.Normalize(c.Text))[0]; prog != "lbctl" && !slices.Contains(tools, prog) {
				tools = append(tools, prog)
			}
		}
	}
	if len(files) == 0 {
		t.Fatal("no sh testbed:WHERE block in README.md and docs/: the extraction is broken")
	}
	// The programs the documented commands start, besides the lbctl the test builds.
	requireEnv(t, tools...)

	// be1 balances its own processes at the socket, for the guide's lbctl socket block.
	tb := newTestbed(t, options{socketLB: true})
	tb.startLBD()
	tb.guideSetup(t)
	failed := ""
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			if failed != "" {
				t.Skipf("not run: it builds on %s, which failed", failed)
			}
			defer func() {
				if t.Failed() {
					failed = f
				}
			}()
			cmds, runs := 0, 0
			for _, b := range byFile[f] {
				tb.settle(t)
				for _, c := range b.Commands {
					n, err := tb.runDocCommand(t, root, b, c)
					runs += n
					if err != nil {
						t.Errorf("%v\n(in the block at %s:%d; the rest of the file is not run)", err, b.File, b.Line)
						return
					}
					cmds++
				}
			}
			t.Logf("%s: %d commands run in the testbed (%d runs over the nodes)", f, cmds, runs)
			if check := guideOutcomes[f]; check != nil {
				check(t, tb)
			}
		})
	}
}

// settle waits, before each block, until the testbed has converged on what the
// commands so far asked for: an operator's commands are seconds apart, the test's are
// not, and a command that observes (birdc show route, lbctl bgp routes) would race the
// change before it. Converged: no LB node has a service still waiting to be programmed,
// and the router routes each service VIP over exactly the LB nodes that advertise it,
// for settleQuiet in a row (the advertisement status follows the programming a moment
// later, so one look could catch both the service and its VIP not yet advertised).
func (tb *testbed) settle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	var since time.Time
	for {
		err := tb.converged()
		switch {
		case err != nil:
			since = time.Time{}
			if time.Now().After(deadline) {
				t.Fatalf("the testbed did not settle within 15s: %v", err)
			}
		case since.IsZero():
			since = time.Now()
		case time.Since(since) >= settleQuiet:
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// settleQuiet is how long the testbed must stay converged to count as settled.
const settleQuiet = 300 * time.Millisecond

// converged returns why the testbed has not converged (see settle), nil if it has.
func (tb *testbed) converged() error {
	advertisers := map[netip.Addr][]*node{}
	for _, lb := range tb.lbs {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := lb.lbd.lb.ListServices(ctx, &lbdv1.ListServicesRequest{})
		cancel()
		if err != nil {
			return fmt.Errorf("%s: list services: %w", lb.name, err)
		}
		for _, s := range resp.GetServices() {
			st := s.GetStatus()
			if st.GetState() == lbdv1.ServiceState_SERVICE_STATE_PENDING {
				return fmt.Errorf("%s: service %s: %s", lb.name, s.GetName(), st.GetReason())
			}
			vip, err := netip.ParseAddr(s.GetVip())
			if err != nil {
				return fmt.Errorf("%s: service %s: %w", lb.name, s.GetName(), err)
			}
			lbs := advertisers[vip]
			if st.GetAdvertised() && !slices.Contains(lbs, lb) {
				lbs = append(lbs, lb)
			}
			advertisers[vip] = lbs
		}
	}
	for vip, lbs := range advertisers {
		got, err := kernelNextHops(tb.routerNS, vip)
		if err != nil {
			return err
		}
		if want := gateways(vip, lbs); !slices.Equal(got, want) {
			return fmt.Errorf("the router routes %s via %v; the LB nodes advertising it are %v", vip, got, want)
		}
	}
	return nil
}

// guideOutcomes check, once the commands of a file ran, that they did what the file
// says: exit codes alone would pass a guide whose service never carries a request. The
// guides' service web is 203.0.113.10:80 (webVIP) over backends on be1 (198.18.1.10)
// and be2 (198.18.1.11).
var guideOutcomes = map[string]func(t *testing.T, tb *testbed){
	"docs/deploy-bare-metal.md": func(t *testing.T, tb *testbed) {
		tb.router.waitNextHops(t, vip4, tb.lbs, 15*time.Second)
		wantAnswers(t, tb, "be1", "be2")
	},
	// lb1 was drained and undrained; 198.18.1.10 was drained and removed.
	"docs/operations.md": func(t *testing.T, tb *testbed) {
		tb.router.waitNextHops(t, vip4, tb.lbs, 15*time.Second)
		wantAnswers(t, tb, "be2")
	},
}

// wantAnswers sends requests from the client to the guides' service and fails unless
// exactly the named backend nodes answer them.
func wantAnswers(t *testing.T, tb *testbed, backends ...string) {
	t.Helper()
	counts := perBackend(tb.getMany(t, webVIP, 30))
	want := map[string]bool{}
	for _, b := range backends {
		want[b] = true
		if counts[b] == 0 {
			t.Errorf("%s answered none of 30 requests to %v (answers: %v)", b, webVIP, counts)
		}
	}
	for b, n := range counts {
		if !want[b] {
			t.Errorf("%s answered %d of 30 requests to %v; want only %v", b, n, webVIP, backends)
		}
	}
}

// guideSetup turns the testbed into the network the guides describe
// (docs/deploy-bare-metal.md): no services yet, since the guide creates its own, and
// backend nodes in 198.18.1.0/24 (be1 198.18.1.10, be2 .11, be3 .12). The LB nodes
// reach that prefix over their uplink; in the guide that is the operator's fabric, not
// a documented command.
func (tb *testbed) guideSetup(t *testing.T) {
	t.Helper()
	for _, s := range tb.defaultServices() {
		tb.lbctlLBs(t, "service", "delete", s.name)
	}
	for i, be := range tb.backends {
		be.ns.AddAddr(t, be.ifc, netip.MustParsePrefix(fmt.Sprintf("198.18.1.%d/24", 10+i)))
	}
	for _, lb := range tb.lbs {
		lb.ns.IP(t, "route add 198.18.1.0/24 dev "+lb.ifc)
	}
}

// docPlace is one namespace a documented command runs in, and what the guide's
// generic names mean there.
type docPlace struct {
	name string // for messages: lb1, be2, router, client
	ns   *testnet.NS
	env  []string
	// prelude is shell code run before the command (functions standing in for
	// defaults that differ in the testbed).
	prelude string
	// replace maps the guide's generic names to the testbed's.
	replace []docReplacement
}

type docReplacement struct {
	re   *regexp.Regexp
	with string
}

// eth0RE finds the guide's name of a node's uplink.
var eth0RE = regexp.MustCompile(`\beth0\b`)

// docPlaces resolves a block's WHERE (docstest.TestbedTargets).
func (tb *testbed) docPlaces(where string) ([]docPlace, error) {
	nodePlace := func(n *node) docPlace {
		return docPlace{
			name: n.name,
			ns:   n.ns,
			env:  []string{"LBCTL_SERVER=unix://" + n.lbd.sock},
			replace: []docReplacement{
				{regexp.MustCompile(regexp.QuoteMeta("/run/lbd/lbd.sock")), n.lbd.sock},
				{eth0RE, n.ifc},
				// The guide's default metrics_listen; the testbed sets its own.
				{regexp.MustCompile(regexp.QuoteMeta("127.0.0.1:9310")), metricsAddr},
			},
		}
	}
	nodes := func(ns []*node) []docPlace {
		var out []docPlace
		for _, n := range ns {
			out = append(out, nodePlace(n))
		}
		return out
	}
	switch where {
	case "lbs":
		return nodes(tb.lbs), nil
	case "backends":
		return nodes(tb.backends), nil
	case "router":
		// birdc's default socket is /run/bird/bird.ctl; the testbed's BIRD uses its own.
		return []docPlace{{name: "router", ns: tb.routerNS,
			prelude: fmt.Sprintf("birdc() { command birdc -s %q \"$@\"; }\n", tb.router.sock)}}, nil
	case "client":
		return []docPlace{{name: "client", ns: tb.clientNS,
			replace: []docReplacement{{eth0RE, tb.clientIf}}}}, nil
	}
	for _, n := range tb.nodes() {
		if n.name == where {
			return []docPlace{nodePlace(n)}, nil
		}
	}
	return nil, fmt.Errorf("testbed has no %q", where)
}

// runDocCommand runs one command of a testbed block on every place the block names and
// returns how many runs succeeded, logging their output in t; the error names the command's file and line, the
// node, and holds the command's output.
func (tb *testbed) runDocCommand(t *testing.T, root string, b docstest.Block, c docstest.Command) (int, error) {
	// Only commands known to stay inside a namespace run here (docstest's classes):
	// everything runs as root on the host's filesystem.
	if err := b.Check(c); err != nil {
		return 0, err
	}
	places, err := tb.docPlaces(b.Testbed)
	if err != nil {
		return 0, fmt.Errorf("%s:%d: %w", c.File, c.Line, err)
	}
	for i, p := range places {
		text := docstest.WithBinDir(c.Text, binDir)
		for _, r := range p.replace {
			text = r.re.ReplaceAllLiteralString(text, r.with)
		}
		ctx, cancel := context.WithTimeout(context.Background(), docsCommandTimeout)
		cmd := p.ns.CommandContext(ctx, "bash", "-c", "set -o pipefail\n"+p.prelude+text)
		cmd.Dir = root
		cmd.Env = append(append(os.Environ(), "PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH")), p.env...)
		// A pipeline's children may keep the output open after bash is killed.
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			return i, fmt.Errorf("%s:%d: on %s: %q failed: %w\n%s", c.File, c.Line, p.name, text, err, out)
		}
		t.Logf("%s:%d: on %s: %s\n%s", c.File, c.Line, p.name, c.Text, strings.TrimRight(string(out), "\n"))
	}
	return len(places), nil
}
