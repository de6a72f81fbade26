//go:build linux

package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/lbd-dev/lbd/bpf/backendtc"
	"github.com/lbd-dev/lbd/bpf/lbxdp"
	"github.com/lbd-dev/lbd/internal/testnet"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The scale benchmarks' node: one lbd with XDP attached to a veth in a namespace of its
// own, its backend nodes reached through one gateway (a second namespace) so that every
// backend is usable. No packet is sent: what is measured is the control plane, the
// pinned maps and the program's own answer (TraceFlow).

// Addresses of the scale node (all in the test address plan).
var (
	scaleLBAddr = netip.MustParsePrefix("198.19.255.1/24")
	scaleGWAddr = netip.MustParsePrefix("198.19.255.2/24")
	// scaleClient is the source of traced flows.
	scaleClient = netip.MustParseAddr("198.19.254.9")
)

// scaleNode is one lbd and its namespace.
type scaleNode struct {
	tb testing.TB
	// owner is the test or benchmark that made the node: lbd runs until it ends,
	// across the sub-benchmarks (tb) that each restart it.
	owner            testing.TB
	ns               *testnet.NS
	ifc              string
	dir, bpffs, sock string
	lbdBin, lbctlBin string
	args             []string
	proc             *testnet.Proc
	conn             *grpc.ClientConn
	lb               lbdv1.LoadBalancerServiceClient
	node             lbdv1.NodeServiceClient
	health           healthpb.HealthClient
	// rounds counts the watch steps, which change weights.
	rounds int
}

// newScaleNode builds the namespaces; start runs lbd in them.
func newScaleNode(tb testing.TB, extra ...string) *scaleNode {
	tb.Helper()
	testnet.Require(tb, "ip", "nsenter")
	sfx := testnet.Suffix(tb)
	n := &scaleNode{tb: tb, owner: tb, ifc: "sclb" + sfx, args: extra}
	n.lbdBin, n.lbctlBin = binaries(tb)
	n.ns = testnet.NewNS(tb, "sc-lb-"+sfx)
	gw := testnet.NewNS(tb, "sc-gw-"+sfx)
	testnet.Veth(tb, testnet.VethEnd{NS: n.ns, Name: n.ifc}, testnet.VethEnd{NS: gw, Name: "scgw" + sfx})
	n.ns.AddAddr(tb, n.ifc, scaleLBAddr)
	gw.AddAddr(tb, "scgw"+sfx, scaleGWAddr)
	// Every backend node is behind the gateway, which answers for itself: the next hop
	// of every backend resolves, and every backend takes new flows.
	n.ns.IP(tb, "route add 198.18.0.0/16 via "+scaleGWAddr.Addr().String())
	gw.PassXDP(tb, "scgw"+sfx)
	var err error
	if n.dir, err = os.MkdirTemp("", "lbd-scale-"); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(n.dir) })
	n.bpffs = testnet.MountDir(tb)
	n.sock = filepath.Join(n.dir, "lbd.sock")
	n.conn, err = grpc.NewClient("unix://"+n.sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(512<<20)))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { n.conn.Close() })
	n.lb, n.node, n.health = lbdv1.NewLoadBalancerServiceClient(n.conn), lbdv1.NewNodeServiceClient(n.conn), healthpb.NewHealthClient(n.conn)
	return n
}

// start runs lbd and returns when the process is started; the caller waits for what it
// measures (the API, readiness).
func (n *scaleNode) start() {
	n.tb.Helper()
	argv := append([]string{n.lbdBin, "--role", "lb", "--interface", n.ifc, "--bpffs-dir", n.bpffs,
		"--state-dir", filepath.Join(n.dir, "state"), "--socket", n.sock, "--metrics-listen", "",
		"--hash-seed", hashSeed}, n.args...)
	n.proc = testnet.Start(n.owner, "lbd-scale", filepath.Join(n.dir, "lbd.log"), n.ns.Command(argv...))
}

// syncWrites returns the map entries lbd's first sync wrote, from its log ("datapath
// maps synced ... writes=N"); the node is ready, so the sync is over.
func (n *scaleNode) syncWrites() uint64 {
	n.tb.Helper()
	m := syncedRE.FindStringSubmatch(n.proc.OwnLog())
	if m == nil {
		n.tb.Fatalf("lbd did not log its first sync:\n%s", n.proc.Tail(20))
	}
	w, err := strconv.ParseUint(m[1], 10, 64)
	if err != nil {
		n.tb.Fatal(err)
	}
	return w
}

var syncedRE = regexp.MustCompile(`datapath maps synced: .*\bwrites=(\d+)`)

// stop sends SIGTERM (pins stay) and waits for lbd to exit.
func (n *scaleNode) stop() {
	n.tb.Helper()
	if err := n.proc.Signal(syscall.SIGTERM); err != nil {
		n.tb.Fatalf("SIGTERM lbd: %v", err)
	}
	select {
	case <-n.proc.Exited():
	case <-time.After(60 * time.Second):
		n.tb.Fatalf("lbd still runs 60 s after SIGTERM:\n%s", n.proc.Tail(40))
	}
}

// waitFor polls fn until it succeeds and returns when it did, failing after timeout or
// if lbd exits.
func (n *scaleNode) waitFor(what string, timeout time.Duration, fn func(ctx context.Context) error) time.Time {
	n.tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		n.conn.ResetConnectBackoff()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := fn(ctx)
		cancel()
		if err == nil {
			return time.Now()
		}
		if !n.proc.Running() {
			n.tb.Fatalf("lbd exited while waiting for %s:\n%s", what, n.proc.Tail(40))
		}
		if time.Now().After(deadline) {
			n.tb.Fatalf("%s: not after %v: %v\n%s", what, timeout, err, n.proc.Tail(20))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// answers is met when the API serves the restored state.
func (n *scaleNode) answers(name string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		_, err := n.lb.GetService(ctx, &lbdv1.GetServiceRequest{Name: name})
		return err
	}
}

// ready is met when gRPC health says SERVING: the programs are attached and the maps
// hold the desired state.
func (n *scaleNode) ready(ctx context.Context) error {
	resp, err := n.health.Check(ctx, &healthpb.HealthCheckRequest{})
	if err == nil && resp.Status != healthpb.HealthCheckResponse_SERVING {
		err = fmt.Errorf("health %v", resp.Status)
	}
	return err
}

// scaleServices returns n services × per backends, named so that their order is their
// index, on distinct frontends, over backend nodes behind the gateway. tableSize 0
// leaves the default.
func scaleServices(n, per int, tableSize uint32) []*lbdv1.Service {
	out := make([]*lbdv1.Service, n)
	for i := range n {
		s := &lbdv1.Service{Name: fmt.Sprintf("scale/svc-%05d", i), Vip: fmt.Sprintf("203.0.113.%d", i%250+1),
			Port: uint32(1000 + i/250), Protocol: lbdv1.Protocol_PROTOCOL_TCP, MaglevTableSize: tableSize}
		for j := range per {
			s.Backends = append(s.Backends, &lbdv1.Backend{Address: fmt.Sprintf("198.18.%d.%d", j+1, i%250+1), Port: uint32(8000 + i/250)})
		}
		out[i] = s
	}
	return out
}

// traced checks that the loaded program sends a new flow to the service to one of its
// backends.
func (n *scaleNode) traced(ctx context.Context, svc *lbdv1.Service, sport uint32) error {
	resp, err := n.lb.TraceFlow(ctx, &lbdv1.TraceFlowRequest{Protocol: svc.Protocol, SourceAddress: scaleClient.String(),
		SourcePort: sport, DestinationAddress: svc.Vip, DestinationPort: svc.Port})
	if err != nil {
		return err
	}
	if resp.ServiceName != svc.Name || resp.Backend == nil {
		return fmt.Errorf("trace to %s: service %q, backend %v (%s: %s)", svc.Name, resp.ServiceName, resp.Backend, resp.Verdict, resp.Reason)
	}
	for _, b := range svc.Backends {
		if b.Address == resp.Backend.Address && b.Port == resp.Backend.Port {
			return nil
		}
	}
	return fmt.Errorf("trace to %s: backend %s:%d is not one of its", svc.Name, resp.Backend.Address, resp.Backend.Port)
}

// programmed is met when lbd says the service is in the maps (READY) and the program
// sends a new flow to it to one of its backends.
func (n *scaleNode) programmed(svc *lbdv1.Service) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		resp, err := n.lb.GetService(ctx, &lbdv1.GetServiceRequest{Name: svc.Name})
		if err != nil {
			return err
		}
		if st := resp.Service.GetStatus(); st.GetState() != lbdv1.ServiceState_SERVICE_STATE_READY {
			return fmt.Errorf("%s: %v: %s", svc.Name, st.GetState(), st.GetReason())
		}
		return n.traced(ctx, svc, 40000)
	}
}

// notReady lists, page by page, the services that are not READY.
func (n *scaleNode) notReady(ctx context.Context) ([]string, int, error) {
	var bad []string
	total := 0
	req := &lbdv1.ListServicesRequest{PageSize: 1000}
	for {
		resp, err := n.lb.ListServices(ctx, req)
		if err != nil {
			return nil, 0, err
		}
		for _, s := range resp.Services {
			total++
			if s.GetStatus().GetState() != lbdv1.ServiceState_SERVICE_STATE_READY {
				bad = append(bad, s.Name+": "+s.GetStatus().GetReason())
			}
		}
		if resp.NextPageToken == "" {
			return bad, total, nil
		}
		req.PageToken = resp.NextPageToken
	}
}

// applyAll applies svcs from empty and returns how long until every one was in the
// maps: the last (by name, the order the reconciler programs a batch in) READY and
// traced, then all of them READY in one list (if some were not, the wait goes on until
// they are: the figure never counts less than all of them).
func (n *scaleNode) applyAll(svcs []*lbdv1.Service) (took, call time.Duration) {
	n.tb.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := n.lb.ApplyServices(ctx, &lbdv1.ApplyServicesRequest{Owner: "scale", Services: svcs}); err != nil {
		n.tb.Fatalf("apply %d services: %v", len(svcs), err)
	}
	call = time.Since(start)
	last := svcs[len(svcs)-1]
	done := n.waitFor("the last service programmed", 10*time.Minute, n.programmed(last))
	for {
		bad, total, err := n.notReady(ctx)
		if err != nil {
			n.tb.Fatal(err)
		}
		if total != len(svcs) {
			n.tb.Fatalf("%d services listed, %d applied", total, len(svcs))
		}
		if len(bad) == 0 {
			break
		}
		if time.Since(start) > 10*time.Minute {
			n.tb.Fatalf("%d services not READY 10 minutes after the apply, first: %s", len(bad), bad[0])
		}
		done = time.Now()
	}
	return done.Sub(start), call
}

// traceSample traces a new flow to k services picked at random (and the first and
// last) and fails unless each goes to one of its backends.
func (n *scaleNode) traceSample(svcs []*lbdv1.Service, k int) {
	n.tb.Helper()
	pick := []*lbdv1.Service{svcs[0], svcs[len(svcs)-1]}
	for range k {
		pick = append(pick, svcs[rand.IntN(len(svcs))])
	}
	for i, s := range pick {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := n.traced(ctx, s, uint32(41000+i))
		cancel()
		if err != nil {
			n.tb.Fatal(err)
		}
	}
}

// rssBytes is lbd's resident set size.
func (n *scaleNode) rssBytes() uint64 { return n.procStatus("VmRSS") }

// procStatus reads a size of lbd's /proc/PID/status in bytes: VmRSS, the resident set
// now; VmHWM, its peak since lbd started or since resetPeakRSS.
func (n *scaleNode) procStatus(field string) uint64 {
	n.tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", n.proc.PID()))
	if err != nil {
		n.tb.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				n.tb.Fatalf("%s %q: %v", field, line, err)
			}
			return kb << 10
		}
	}
	n.tb.Fatalf("no %s in /proc/PID/status", field)
	return 0
}

// cpuTime is the CPU time (user and system) lbd has used so far, from /proc/PID/stat:
// on a machine shared with other work, lbd's CPU time over the CPUs available bounds
// what its wall time would be on an idle one.
func (n *scaleNode) cpuTime() time.Duration {
	n.tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n.proc.PID()))
	if err != nil {
		n.tb.Fatal(err)
	}
	// Fields after the command (which may hold spaces) in parentheses; utime and stime
	// are the 14th and 15th fields, in clock ticks (USER_HZ, 100 on Linux).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		n.tb.Fatalf("/proc/PID/stat: %q", b)
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		n.tb.Fatalf("/proc/PID/stat: %q", b)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// resetPeakRSS sets lbd's VmHWM to its resident set now (proc(5), clear_refs), so that
// VmHWM read later is the peak of what happened in between, however short.
func (n *scaleNode) resetPeakRSS() {
	n.tb.Helper()
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", n.proc.PID()), []byte("5"), 0); err != nil {
		n.tb.Fatalf("reset lbd's peak RSS: %v", err)
	}
}

// learnedMapNames are the maps of learned flows, sized by configuration and not by the
// services: left out of the services' map memory.
var learnedMapNames = []string{lbxdp.MapConntrack4, lbxdp.MapConntrack6, lbxdp.MapAffinity, backendtc.MapNAT}

// mapMemory is the kernel memory (memlock) of the maps pinned below lbd's bpffs
// directory and of the maps they hold (map-in-map tables), those of learned flows
// apart; maps counts them.
func (n *scaleNode) mapMemory() (services, learned uint64, maps int) {
	n.tb.Helper()
	seen := map[ebpf.MapID]bool{}
	var add func(m *ebpf.Map) error
	add = func(m *ebpf.Map) error {
		info, err := m.Info()
		if err != nil {
			return err
		}
		id, _ := info.ID()
		if seen[id] {
			return nil
		}
		seen[id] = true
		maps++
		mem, _ := info.Memlock()
		if slices.Contains(learnedMapNames, info.Name) {
			learned += mem
		} else {
			services += mem
		}
		if m.Type() != ebpf.ArrayOfMaps && m.Type() != ebpf.HashOfMaps {
			return nil
		}
		key := make([]byte, m.KeySize())
		var inner ebpf.MapID
		it := m.Iterate()
		for it.Next(key, &inner) {
			im, err := ebpf.NewMapFromID(inner)
			if err != nil {
				continue // replaced meanwhile
			}
			err = add(im)
			im.Close()
			if err != nil {
				return err
			}
		}
		return it.Err()
	}
	err := filepath.WalkDir(n.bpffs, func(path string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			return nil // a pinned program or link
		}
		defer m.Close()
		return add(m)
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		n.tb.Fatalf("read the pinned maps: %v", err)
	}
	return services, learned, maps
}
