//go:build linux

package integration

// LB nodes forward what they advertise: next hops that lbd resolves itself on a cold
// edge, VIPs withdrawn when no backend node can be reached, readiness that follows the
// datapath, drift that is repaired, and one lbd per datapath.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/bpf/lbxdp"
	"github.com/lbd-dev/lbd/internal/testnet"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// flushNeighbours empties an LB node's neighbour table, as on a freshly booted host.
func (n *node) flushNeighbours(t *testing.T) {
	t.Helper()
	n.ns.IP(t, "neigh flush all")
}

// noNeighbourPassed sums the packets the LB nodes sent through the kernel because a
// next hop was not resolved.
func (tb *testbed) noNeighbourPassed(t *testing.T) uint64 {
	var n uint64
	for _, lb := range tb.lbs {
		n += lb.lbd.reasonCount(t, "lb_pass_no_neighbour")
	}
	return n
}

// TestColdEdge: LB nodes without a single neighbour entry (flushed after setup, no
// warm-up traffic) answer 300 of 300 requests, the first included; flushing their
// neighbour tables again in the middle of a second run of 300 fails none. Afterwards
// lbd keeps a managed, resolved entry for every backend node.
func TestColdEdge(t *testing.T) {
	tb := newLB(t, options{})
	for _, lb := range tb.lbs {
		lb.flushNeighbours(t)
	}
	tb.getMany(t, webVIP, 300)
	t.Logf("after the first run: %d packets went through the kernel to resolve a next hop", tb.noNeighbourPassed(t))

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(300 * time.Millisecond)
		for _, lb := range tb.lbs {
			lb.flushNeighbours(t)
		}
	}()
	tb.getMany(t, webVIP, 300)
	wg.Wait()
	t.Logf("after the second run: %d packets went through the kernel", tb.noNeighbourPassed(t))

	for _, lb := range tb.lbs {
		eventually(t, 10*time.Second, func() error {
			var node lbdv1.Node
			lb.lbd.lbctlJSON(t, &node, "node", "get")
			hops := node.GetNextHops()
			if len(hops) != len(tb.backends) {
				return fmt.Errorf("%s: %d next hops, want one per backend node: %v", lb.name, len(hops), hops)
			}
			for _, h := range hops {
				if !h.GetReachable() || !h.GetManaged() || h.GetNeighbour() != "REACHABLE" {
					return fmt.Errorf("%s: next hop %v", lb.name, h)
				}
			}
			return nil
		})
	}
}

// TestUnreachableBackendNodes: when an LB node loses its routes to every backend node
// of a VIP, the router stops sending it the VIP within 3 s and the service's status
// says why; when the routes return, so does the VIP within 3 s.
func TestUnreachableBackendNodes(t *testing.T) {
	tb := newLB(t, options{})
	lb1, lb2 := tb.lbs[0], tb.lbs[1]
	var add, del []string
	for _, be := range tb.backends {
		add = append(add, fmt.Sprintf("route add unreachable %s/32", be.addr4))
		del = append(del, fmt.Sprintf("route del unreachable %s/32", be.addr4))
	}
	lb1.ns.IP(t, add...)
	took := tb.router.waitNextHops(t, vip4, []*node{lb2}, 3*time.Second)
	t.Logf("VIP withdrawn from %s %v after its routes to the backend nodes were removed", lb1.name, took)
	var st *lbdv1.ServiceStatus
	eventually(t, 5*time.Second, func() error {
		st = lb1.lbd.service(t, "web").GetStatus()
		if st.GetAdvertised() || !strings.Contains(st.GetReason(), "no route to backend node "+tb.backends[0].addr4.String()) {
			return fmt.Errorf("status of web on %s: advertised %v, reason %q, want the missing route named", lb1.name, st.GetAdvertised(), st.GetReason())
		}
		return nil
	})
	t.Logf("lbctl service get web on %s: %s; advertise: %s", lb1.name, st.GetReason(), st.GetAdvertiseReason())
	tb.getMany(t, webVIP, 30) // all through lb2

	lb1.ns.IP(t, del...)
	took = tb.router.waitNextHops(t, vip4, tb.lbs, 3*time.Second)
	t.Logf("VIP back on %s %v after the routes returned", lb1.name, took)
	tb.getMany(t, webVIP, 30)
}

// TestTwoInterfaceLB: an LB node takes client traffic on its uplink and reaches the
// backend nodes over a second link; the Geneve packets leave with the second link's
// address as source, which is what the backend nodes accept.
func TestTwoInterfaceLB(t *testing.T) {
	tb := newTestbed(t, options{backendLink: true})
	be := tb.backends[0]
	caps := be.ns.Capture(t, be.backIfc)
	tb.startLBD()
	tb.getMany(t, webVIP, 60)
	frames := caps.Stop()
	sources := map[netip.Addr]int{}
	for _, f := range frames {
		if d, ok := decode(f); ok && d.geneve != nil && !f.Outgoing {
			sources[d.src]++
		}
	}
	if len(sources) == 0 {
		t.Fatalf("no Geneve packet reached %s over the backend network", be.name)
	}
	for src, n := range sources {
		want := false
		for _, lb := range tb.lbs {
			want = want || src == lb.backAddr4
		}
		if !want {
			t.Errorf("%d Geneve packets with outer source %v, want an LB node's backend-network address", n, src)
		}
	}
	t.Logf("Geneve outer sources seen on %s: %v", be.backIfc, sources)
}

// health asks a daemon's gRPC health service about the whole server.
func (d *daemon) health(t *testing.T) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(d.conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatalf("%s: health check: %v", d.node.name, err)
	}
	return resp.GetStatus()
}

// readyz fetches /readyz from inside the daemon's namespace.
func (d *daemon) readyz(t *testing.T) (int, string) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialIn(ctx, d.node.ns, network, addr)
		},
	}}
	resp, err := client.Get("http://" + metricsAddr + "/readyz")
	if err != nil {
		t.Fatalf("%s: readyz: %v", d.node.name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// waitNotReady waits until gRPC health says NOT_SERVING and /readyz 503, and returns
// how long that took.
func (d *daemon) waitNotReady(t *testing.T, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	eventually(t, timeout, func() error {
		if st := d.health(t); st != healthpb.HealthCheckResponse_NOT_SERVING {
			return fmt.Errorf("%s: gRPC health %v", d.node.name, st)
		}
		if code, body := d.readyz(t); code != http.StatusServiceUnavailable {
			return fmt.Errorf("%s: /readyz %d %s", d.node.name, code, body)
		}
		return nil
	})
	return time.Since(start)
}

// TestDetachNotReady: a node detached with lbctl is not ready (gRPC health
// NOT_SERVING, /readyz 503) within 2 s and its VIPs leave the router within 3 s; it
// stays detached, as asked.
func TestDetachNotReady(t *testing.T) {
	tb := newLB(t, options{})
	lb1, lb2 := tb.lbs[0], tb.lbs[1]
	if st := lb1.lbd.health(t); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("before: gRPC health %v", st)
	}
	if code, body := lb1.lbd.readyz(t); code != http.StatusOK {
		t.Fatalf("before: /readyz %d %s", code, body)
	}
	start := time.Now()
	lb1.lbd.lbctl(t, "node", "detach", "--yes")
	notReady := lb1.lbd.waitNotReady(t, 2*time.Second)
	gone := tb.router.waitNextHops(t, vip4, []*node{lb2}, 3*time.Second)
	_, body := lb1.lbd.readyz(t)
	t.Logf("lbctl node detach: not ready after %v (%s), VIP withdrawn %v later, %v in all", notReady, body, gone, time.Since(start))
	var resp lbdv1.TraceFlowResponse
	lb1.lbd.lbctlJSON(t, &resp, "trace", "tcp", client4.String(), "40000", vip4.String(), fmt.Sprint(webPort))
	if resp.GetVerdict() != "NOT_ATTACHED" || !strings.Contains(resp.GetReason(), "not attached") {
		t.Errorf("trace on a detached node: %s: %s", resp.GetVerdict(), resp.GetReason())
	}
	time.Sleep(2 * lb1.lbd.verifyInterval())
	if st := lb1.lbd.health(t); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("a node detached on purpose became %v again", st)
	}
}

// waitNewLog waits until the daemon logs a line holding want after the call.
func (d *daemon) waitNewLog(t *testing.T, want string, timeout time.Duration) {
	t.Helper()
	from := int64(0)
	if st, err := os.Stat(d.proc.Log); err == nil {
		from = st.Size()
	}
	eventually(t, timeout, func() error {
		b, err := os.ReadFile(d.proc.Log)
		if err != nil {
			return err
		}
		if int64(len(b)) > from && strings.Contains(string(b[from:]), want) {
			return nil
		}
		return fmt.Errorf("%s logged no %q yet", d.node.name, want)
	})
}

// xdpLinkID is the ID of the XDP link lbd pinned for a node's uplink.
func (d *daemon) xdpLinkID(t *testing.T) int {
	t.Helper()
	out := testnet.Run(t, "bpftool", "-j", "link", "show", "pinned", filepath.Join(d.bpffs, "links", "xdp-"+d.node.ifc))
	var l struct {
		ID int `json:"id"`
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil || l.ID == 0 {
		t.Fatalf("bpftool link show: %v: %s", err, out)
	}
	return l.ID
}

// TestDetachedFromOutside: the XDP program detached behind lbd's back (`ip link set
// dev IF xdp off` is refused for a link-based attachment; `bpftool link detach` is
// what removes it) makes the node not ready within 2 s and withdraws its VIPs within
// 3 s; lbd attaches the program again at its next verification, counts the repair,
// and the node is ready and forwarding again.
func TestDetachedFromOutside(t *testing.T) {
	const verify = 6 * time.Second
	tb := newLB(t, options{verifyInterval: verify})
	lb1, lb2 := tb.lbs[0], tb.lbs[1]

	if out, err := lb1.ns.Command("ip", "link", "set", "dev", lb1.ifc, "xdp", "off").CombinedOutput(); err == nil {
		t.Errorf("ip link set xdp off succeeded on a link-based attachment: %s", out)
	}
	if st := lb1.lbd.health(t); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("after a refused xdp off: gRPC health %v", st)
	}

	// Right after a verification pass, so that the next one is a whole interval away.
	lb1.lbd.waitNewLog(t, "datapath verified", 2*verify)
	id := lb1.lbd.xdpLinkID(t)
	start := time.Now()
	testnet.Run(t, "bpftool", "link", "detach", "id", fmt.Sprint(id))
	notReady := lb1.lbd.waitNotReady(t, 2*time.Second)
	gone := tb.router.waitNextHops(t, vip4, []*node{lb2}, 3*time.Second)
	t.Logf("XDP link %d detached from outside: not ready after %v, VIP withdrawn after %v", id, notReady, gone)

	eventually(t, verify+2*time.Second, func() error {
		if st := lb1.lbd.health(t); st != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("gRPC health %v", st)
		}
		return nil
	})
	repaired := time.Since(start)
	tb.router.waitNextHops(t, vip4, tb.lbs, 5*time.Second)
	m := parseMetrics(t, lb1.lbd.scrape(t))
	if n := m[`lbd_datapath_drift_repaired_total{kind="attachment"}`]; n != 1 {
		t.Errorf("attachment repairs counted: %v, want 1", n)
	}
	t.Logf("attached again and ready %v after the detach (verify interval %v)", repaired, verify)
	tb.getMany(t, webVIP, 60)
	for _, lb := range tb.lbs {
		if lb.lbd.serviceStats(t, "web").GetNewFlows() == 0 {
			t.Errorf("%s forwards no new flow after the repair", lb.name)
		}
	}
}

// bpftoolBytes writes b as bpftool's "hex" bytes.
func bpftoolBytes(b []byte) []string {
	out := []string{"hex"}
	for _, c := range b {
		out = append(out, fmt.Sprintf("%02x", c))
	}
	return out
}

// TestDriftRepair: a backend entry rewritten and a service entry deleted with bpftool
// are put back at the next verification (here every 3 s), counted by kind and logged;
// requests are answered again afterwards.
func TestDriftRepair(t *testing.T) {
	const verify = 3 * time.Second
	tb := newLB(t, options{verifyInterval: verify})
	lb1 := tb.lbs[0]
	maps := filepath.Join(lb1.lbd.bpffs, "lb")
	web := lb1.lbd.service(t, "web")
	be := web.GetBackends()[0]

	// lb_backends[id]: the backend's port becomes 1 (struct lb_backend: addr, node
	// address, port, family, node family).
	key := binary.LittleEndian.AppendUint32(nil, be.GetId())
	val := make([]byte, 36)
	copy(val[0:], netip.MustParseAddr(be.GetAddress()).AsSlice())
	copy(val[16:], netip.MustParseAddr(be.GetNodeAddress()).AsSlice())
	binary.BigEndian.PutUint16(val[32:], 1)
	val[34], val[35] = 4, 4
	// lb_services key of web (struct lb_service_key: address, port, protocol, family).
	skey := make([]byte, 20)
	copy(skey, vip4.AsSlice())
	binary.BigEndian.PutUint16(skey[16:], webPort)
	skey[18], skey[19] = 6, 4

	start := time.Now()
	testnet.Run(t, append(append(append([]string{"bpftool", "map", "update", "pinned", filepath.Join(maps, lbxdp.MapBackends), "key"},
		bpftoolBytes(key)...), "value"), bpftoolBytes(val)...)...)
	testnet.Run(t, append([]string{"bpftool", "map", "delete", "pinned", filepath.Join(maps, lbxdp.MapServices), "key"}, bpftoolBytes(skey)...)...)

	eventually(t, verify+2*time.Second, func() error {
		m := parseMetrics(t, lb1.lbd.scrape(t))
		if m[`lbd_datapath_drift_repaired_total{kind="backend"}`] < 1 || m[`lbd_datapath_drift_repaired_total{kind="service"}`] < 1 {
			return fmt.Errorf("repairs not counted yet")
		}
		return nil
	})
	t.Logf("both repaired %v after the change (verify interval %v)", time.Since(start), verify)
	out := testnet.Run(t, "bpftool", "-j", "map", "lookup", "pinned", filepath.Join(maps, lbxdp.MapBackends), "key", "hex",
		fmt.Sprintf("%02x", key[0]), fmt.Sprintf("%02x", key[1]), fmt.Sprintf("%02x", key[2]), fmt.Sprintf("%02x", key[3]))
	if strings.Contains(out, `"0x00","0x01"`) {
		t.Errorf("backend entry still holds port 1: %s", out)
	}
	lb1.lbd.proc.WaitLog(t, "datapath drift repaired", time.Second)
	if log := lb1.lbd.proc.Tail(200); !regexp.MustCompile(`drift repaired.*kind=backend`).MatchString(log) ||
		!regexp.MustCompile(`drift repaired.*kind=service`).MatchString(log) {
		t.Errorf("log does not name both repairs:\n%s", log)
	}
	tb.getMany(t, webVIP, 60)
	var resp lbdv1.VerifyNodeResponse
	lb1.lbd.lbctlJSON(t, &resp, "node", "verify")
	if len(resp.GetRepaired()) != 0 {
		t.Errorf("lbctl node verify after the repair: %v", resp.GetRepaired())
	}
}

// runRefused runs a second lbd in ns with args and returns its exit code, output and
// how long it ran, failing the test if it runs for more than 10 s.
func runRefused(t *testing.T, ns *testnet.NS, args ...string) (int, string, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := ns.CommandContext(ctx, args...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	if ctx.Err() != nil {
		t.Fatalf("the second lbd still ran after 10 s:\n%s", out)
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, string(out), took
}

// TestOneOwnerPerDatapath: a second lbd on the same bpffs directory, or on the same
// interface with a bpffs directory of its own, exits non-zero within 2 s naming the
// PID of the running one, while a long-lived connection through that one keeps
// echoing.
func TestOneOwnerPerDatapath(t *testing.T) {
	tb := newLB(t, options{})
	s := tb.openStream(t, streamVIP)
	lb, _ := tb.carrier(t, s.local)
	d := lb.lbd
	pid := fmt.Sprint(d.proc.PID())
	other := t.TempDir()
	for _, tc := range []struct{ name, bpffs, want string }{
		{"same bpffs directory", d.bpffs, "bpffs directory " + d.bpffs + " is in use by another lbd (PID " + pid + ")"},
		{"same interface", filepath.Join(tb.bpffs, lb.name+"-second"), "interface " + lb.ifc + " is in use by another lbd (PID " + pid + ")"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.MkdirAll(tc.bpffs, 0o700); err != nil {
				t.Fatal(err)
			}
			_, n0, _ := s.state()
			code, out, took := runRefused(t, lb.ns, tb.lbdBin, "--role", "lb", "--interface", lb.ifc, "--bpffs-dir", tc.bpffs,
				"--state-dir", filepath.Join(other, tc.name, "state"), "--socket", filepath.Join(other, tc.name, "lbd.sock"),
				"--metrics-listen", "", "--hash-seed", hashSeed)
			if code == 0 || took > 2*time.Second || !strings.Contains(out, tc.want) {
				t.Errorf("second lbd: exit %d after %v, output:\n%s\nwant a non-zero exit within 2 s saying %q", code, took, out, tc.want)
			}
			t.Logf("refused in %v with exit %d: %s", took, code, strings.TrimSpace(out))
			if err := s.progress(n0+20, 10*time.Second); err != nil {
				t.Fatalf("the connection through %s stopped echoing: %v", lb.name, err)
			}
		})
	}
	if st := d.health(t); st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("the running lbd is %v after the refused starts", st)
	}
}
