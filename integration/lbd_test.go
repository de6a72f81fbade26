//go:build linux

package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/testnet"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// hashSeed is given to every LB daemon: same backends, table size and seed give the
// same Maglev table on every node.
const hashSeed = "20240601"

// metricsAddr is where every daemon serves /metrics, on its own namespace's loopback.
const metricsAddr = "127.0.0.1:9100"

// daemon is one lbd on a node.
type daemon struct {
	tb            *testbed
	node          *node
	role          string // "lb" or "backend"
	dir           string
	sock          string
	bpffs         string
	conntrackSize int
	// bgp gives an LB daemon a configuration file with a BGP session to the router;
	// gracefulRestart enables graceful restart on it.
	bgp             bool
	gracefulRestart bool
	// etcdCA replaces the CA an LB daemon on the etcd store trusts (options.etcd);
	// fileStore puts it back on the file store.
	etcdCA    string
	fileStore bool
	proc      *testnet.Proc
	conn      *grpc.ClientConn
	lb        lbdv1.LoadBalancerServiceClient
	nodeAPI   lbdv1.NodeServiceClient
}

// startLBD starts lbd on every node and creates the default services on the LB nodes:
// web (TCP webPort), stream (TCP streamPt) and dns (UDP dnsPort) on vip4, each over
// every backend.
func (tb *testbed) startLBD() {
	t := tb.t
	tb.lbdBin, tb.lbctlBin = binaries(t)
	if tb.opts.etcd {
		tb.startEtcd()
	}
	for _, n := range tb.nodes() {
		role := "backend"
		if strings.HasPrefix(n.name, "lb") {
			role = "lb"
		}
		d := &daemon{tb: tb, node: n, role: role, dir: filepath.Join(tb.dir, n.name),
			bpffs: filepath.Join(tb.bpffs, n.name), conntrackSize: tb.opts.conntrackSize,
			bgp: role == "lb" && !tb.opts.staticRoutes, gracefulRestart: !tb.opts.noGracefulRestart}
		d.sock = filepath.Join(d.dir, "lbd.sock")
		if err := os.MkdirAll(d.dir, 0o700); err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient("unix://"+d.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		d.conn, d.lb, d.nodeAPI = conn, lbdv1.NewLoadBalancerServiceClient(conn), lbdv1.NewNodeServiceClient(conn)
		n.lbd = d
		d.start(t)
		if tb.opts.etcd && role == "lb" {
			d.waitFleet(t)
		}
	}
	for _, s := range tb.defaultServices() {
		tb.createService(t, s)
	}
	if !tb.opts.staticRoutes {
		tb.router.waitRoutes(t)
	}
}

// configFile is the path of an LB daemon's configuration file.
func (d *daemon) configFile() string { return filepath.Join(d.dir, "lbd.yaml") }

// writeConfig writes the daemon's configuration file: the node's own settings (which
// the file must hold to be valid on its own; the flags repeat them), the testbed's
// datapath settings, and for an LB daemon with BGP one peer, the router, with the
// testbed's short timers.
func (d *daemon) writeConfig(t *testing.T) {
	t.Helper()
	cfg := fmt.Sprintf(`roles: [%s]
state_dir: %s
api: {socket: %s}
datapath: {interfaces: [%s], bpffs_dir: %s, verify_interval: %s, lb_sources: [%s, %s]%s}
`, d.role, filepath.Join(d.dir, "state"), d.sock, d.node.ifc, d.bpffs, d.verifyInterval(), fabric4, fabric6, d.tb.opts.datapathYAML)
	if d.bgp {
		cfg += d.bgpConfig()
	}
	if d.tb.opts.etcd && d.role == "lb" && !d.fileStore {
		cfg += d.storeConfig(d.etcdCA)
	}
	if err := os.WriteFile(d.configFile(), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
}

// bgpConfig is the bgp section of an LB daemon's configuration.
func (d *daemon) bgpConfig() string {
	gr := "{enabled: false}"
	if d.gracefulRestart {
		gr = "{enabled: true, restart_time: 60s}"
	}
	return fmt.Sprintf(`bgp:
  router_id: %s
  local_as: %d
  listen_port: 0
  next_hop_v4: %s
  next_hop_v6: %s
  peers:
    - address: %s
      as: %d
      hold_time: %ds
      keepalive_interval: %ds
      connect_retry: 1s
      graceful_restart: %s
`, d.node.addr4, lbAS, d.node.addr4, d.node.addr6,
		routerFabric4, routerAS, int(bgpHold.Seconds()), int(bgpKeepalive.Seconds()), gr)
}

// verifyInterval is the daemon's datapath.verify_interval.
func (d *daemon) verifyInterval() time.Duration {
	if v := d.tb.opts.verifyInterval; v > 0 {
		return v
	}
	return 5 * time.Second
}

func (d *daemon) args() []string {
	a := []string{"--config", d.configFile()}
	// Debug logs say when each verification pass ran (forward_test.go waits for one).
	a = append(a,
		"--role", d.role, "--interface", d.node.ifc, "--bpffs-dir", d.bpffs,
		"--state-dir", filepath.Join(d.dir, "state"), "--socket", d.sock,
		"--metrics-listen", metricsAddr, "--log-level", "debug",
	)
	if d.role == "lb" {
		a = append(a, "--hash-seed", hashSeed)
		if d.conntrackSize > 0 {
			a = append(a, "--conntrack-size", fmt.Sprint(d.conntrackSize))
		}
	} else if d.tb.opts.backendLink {
		// Geneve arrives over the second link, from the LB nodes' addresses there.
		a = append(a, "--interface", d.node.backIfc, "--lb-source", backnet4.String(), "--lb-source", backnet6.String())
	} else {
		a = append(a, "--lb-source", fabric4.String(), "--lb-source", fabric6.String())
	}
	if d.tb.opts.socketLB && d.node == d.tb.backends[0] {
		a = append(a, "--socket-lb-cgroup", d.tb.cgroup)
	}
	return a
}

// start runs lbd and waits until its API answers with the datapath attached.
func (d *daemon) start(t *testing.T) {
	t.Helper()
	d.writeConfig(t)
	d.proc = d.tb.spawn("lbd-"+d.node.name, d.node.ns, nil, append([]string{d.tb.lbdBin}, d.args()...)...)
	deadline := time.Now().Add(20 * time.Second)
	for {
		// After a crash the client backs off before reconnecting; the test knows better.
		d.conn.ResetConnectBackoff()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := d.nodeAPI.GetNode(ctx, &lbdv1.GetNodeRequest{})
		cancel()
		if err == nil && resp.GetNode().GetDatapathAttached() {
			return
		}
		if !d.proc.Running() {
			t.Fatalf("lbd on %s exited:\n%s", d.node.name, d.proc.Tail(40))
		}
		if time.Now().After(deadline) {
			t.Fatalf("lbd on %s: no attached datapath after 20s (last: %v, %v):\n%s", d.node.name,
				resp.GetNode(), err, d.proc.Tail(40))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// crash kills lbd with SIGKILL: no shutdown code runs, the datapath stays pinned.
func (d *daemon) crash() { d.proc.Kill() }

// stop sends lbd SIGTERM, a plain stop, and waits for it to exit.
func (d *daemon) stop(t *testing.T) {
	t.Helper()
	if err := d.proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM lbd on %s: %v", d.node.name, err)
	}
	select {
	case <-d.proc.Exited():
	case <-time.After(20 * time.Second):
		t.Fatalf("lbd on %s still runs 20s after SIGTERM:\n%s", d.node.name, d.proc.Tail(40))
	}
}

// lbctl runs lbctl against one daemon and returns its output.
func (d *daemon) lbctl(t *testing.T, args ...string) string {
	t.Helper()
	return testnet.Run(t, append([]string{d.tb.lbctlBin, "-s", "unix://" + d.sock}, args...)...)
}

// lbctlJSON runs lbctl with -o json against one daemon and decodes its answer, the
// API's response message in the canonical JSON mapping, into msg.
func (d *daemon) lbctlJSON(t *testing.T, msg proto.Message, args ...string) {
	t.Helper()
	out := d.lbctl(t, append([]string{"-o", "json"}, args...)...)
	if err := protojson.Unmarshal([]byte(out), msg); err != nil {
		t.Fatalf("lbctl %s: decode %T: %v: %s", strings.Join(args, " "), msg, err, out)
	}
}

// lbctlLBs runs the same lbctl command on every LB node, as an operator (or the
// Kubernetes adapter) keeps their desired state identical.
func (tb *testbed) lbctlLBs(t *testing.T, args ...string) {
	t.Helper()
	for _, lb := range tb.lbs {
		lb.lbd.lbctl(t, args...)
	}
}

// svcSpec is a service as the tests create it with lbctl.
type svcSpec struct {
	name     string
	vip      netip.Addr
	port     int
	proto    string
	backends []string // lbctl --backend values
}

func (tb *testbed) defaultServices() []svcSpec {
	var web, stream, dns []string
	for _, be := range tb.backends {
		node := ""
		if tb.opts.backendLink {
			node = ",node=" + be.backAddr4.String()
		}
		web = append(web, netip.AddrPortFrom(be.addr4, httpPort).String()+node)
		stream = append(stream, netip.AddrPortFrom(be.addr4, echoPort).String()+node)
		dns = append(dns, netip.AddrPortFrom(be.addr4, udpPort).String()+node)
	}
	return []svcSpec{
		{"web", vip4, webPort, "tcp", web},
		{"stream", vip4, streamPt, "tcp", stream},
		{"dns", vip4, dnsPort, "udp", dns},
	}
}

// createService creates a service on every LB node and waits until each reports it
// ready.
func (tb *testbed) createService(t *testing.T, s svcSpec) {
	t.Helper()
	args := []string{"service", "create", s.name, "--vip", s.vip.String(), "--port", fmt.Sprint(s.port),
		"--protocol", s.proto}
	for _, b := range s.backends {
		args = append(args, "--backend", b)
	}
	if tb.opts.etcd {
		// One node's API changes the fleet.
		tb.lbs[0].lbd.lbctl(t, args...)
	} else {
		tb.lbctlLBs(t, args...)
	}
	tb.waitService(t, s.name, func(svc *lbdv1.Service) error {
		if st := svc.GetStatus().GetState(); st != lbdv1.ServiceState_SERVICE_STATE_READY {
			return fmt.Errorf("state %v: %s", st, svc.GetStatus().GetReason())
		}
		return nil
	})
}

// waitService waits until check accepts the service on every LB node.
func (tb *testbed) waitService(t *testing.T, name string, check func(*lbdv1.Service) error) {
	t.Helper()
	eventually(t, 10*time.Second, func() error {
		for _, lb := range tb.lbs {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			resp, err := lb.lbd.lb.GetService(ctx, &lbdv1.GetServiceRequest{Name: name})
			cancel()
			if err != nil {
				return fmt.Errorf("%s: get service %s: %w", lb.name, name, err)
			}
			if err := check(resp.GetService()); err != nil {
				return fmt.Errorf("%s: service %s: %w", lb.name, name, err)
			}
		}
		return nil
	})
}

// waitSlots waits until the backend's share of the Maglev table on every LB node
// satisfies ok: the sign that a backend change reached the datapath.
func (tb *testbed) waitSlots(t *testing.T, svc string, backend netip.AddrPort, ok func(slots uint32) bool) {
	t.Helper()
	tb.waitService(t, svc, func(s *lbdv1.Service) error {
		for _, b := range s.GetBackends() {
			if b.GetAddress() == backend.Addr().String() && b.GetPort() == uint32(backend.Port()) {
				if !ok(b.GetTableSlots()) {
					return fmt.Errorf("backend %v has %d table slots", backend, b.GetTableSlots())
				}
				return nil
			}
		}
		return fmt.Errorf("no backend %v", backend)
	})
}

// eventually retries fn until it succeeds or the timeout passes.
func eventually(t testing.TB, timeout time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// connections lists the conntrack entries of a daemon whose client is the test client.
func (d *daemon) connections(t *testing.T) []*lbdv1.Connection {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := d.lb.ListConnections(ctx, &lbdv1.ListConnectionsRequest{})
	if err != nil {
		t.Fatalf("%s: list connections: %v", d.node.name, err)
	}
	return resp.GetConnections()
}

// flowBackend returns the backend address that a daemon's conntrack records for the
// client flow from local, or "" if it has none.
func (d *daemon) flowBackend(t *testing.T, local netip.AddrPort) string {
	t.Helper()
	for _, c := range d.connections(t) {
		if c.GetClientAddress() == local.Addr().Unmap().String() && c.GetClientPort() == uint32(local.Port()) {
			return c.GetBackendAddress()
		}
	}
	return ""
}

// carrier returns the LB node whose conntrack holds the client flow from local, and
// the backend address it records.
func (tb *testbed) carrier(t *testing.T, local netip.AddrPort) (*node, string) {
	t.Helper()
	var found *node
	var backend string
	for _, lb := range tb.lbs {
		if b := lb.lbd.flowBackend(t, local); b != "" {
			if found != nil {
				t.Fatalf("flow from %v is in the conntrack of both %s and %s", local, found.name, lb.name)
			}
			found, backend = lb, b
		}
	}
	if found == nil {
		t.Fatalf("flow from %v is in no LB node's conntrack", local)
	}
	return found, backend
}

// scrape fetches /metrics of a daemon from inside its namespace.
func (d *daemon) scrape(t *testing.T) string {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialIn(ctx, d.node.ns, network, addr)
		},
	}}
	resp, err := client.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatalf("%s: scrape: %v", d.node.name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: scrape: %s %v", d.node.name, resp.Status, err)
	}
	return string(b)
}

// dialIn connects from inside a namespace.
func dialIn(ctx context.Context, ns *testnet.NS, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := ns.DoErr(func() error {
		var err error
		conn, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}
