//go:build linux

package integration

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/pktgen"
	"github.com/lbd-dev/lbd/internal/testnet"
	"github.com/lbd-dev/lbd/internal/xdpgen"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The real-path topology: an injector, one LB node, two backend nodes, each pair of
// namespaces joined by its own veth. The same frames go through whichever forwarder
// the LB node runs: lbd, the kernel's IP forwarding, or an nftables DNAT balancer.
//
//	gen ──(uplink)── LB ──┬── be1   (counts and drops at XDP)
//	                      └── be2
//
// CPU: the LB node's uplink is polled by a threaded NAPI kthread pinned to lbCPU,
// where nothing else of the test runs; the injector, the backends' NAPI threads and
// lbd's own threads run on genCPU. All the LB node's forwarding work (XDP, or the
// kernel's receive, GRO, netfilter, routing, and the hand-over to the backend veth)
// runs in that one thread, so its CPU time is the LB node's cost.
//
// The three threads that move the packets are SCHED_FIFO, ahead of every normal task:
// on a busy machine the injector and the LB node would otherwise take turns with other
// work, and packets per second would measure the scheduler. The backends' threads come
// before the injector on their shared CPU, so that what the LB node forwards is
// counted. The kernel keeps 5% of each CPU for normal tasks (sched_rt_runtime_us):
// the LB node's busy fraction tops out near 0.95.
const (
	genCPU = 0
	lbCPU  = 1

	rpPrioGen     = 10
	rpPrioLB      = 50
	rpPrioBackend = 60
)

var (
	rpVIP       = netip.MustParseAddr("203.0.113.64")
	rpGenAddr   = netip.MustParsePrefix("198.18.64.2/24")
	rpUplink    = netip.MustParsePrefix("198.18.64.1/24")
	rpGenMAC    = net.HardwareAddr{0x02, 0, 0, 0, 0x64, 0x02}
	rpUplinkMAC = net.HardwareAddr{0x02, 0, 0, 0, 0x64, 0x01}
	// rpClients are the injector's source addresses: 2^15 of them, the source ports
	// 1024 and up.
	rpClients = netip.MustParseAddr("198.18.128.0")
)

const (
	rpPort     = 80
	rpSources  = 1 << 15
	rpFirstPt  = 1024
	rpPorts    = 4000
	rpFewFlows = 4
	// rpFrameLen is a minimum Ethernet frame without its FCS: 64 bytes on a wire.
	rpFrameLen = 60
)

type realPath struct {
	tb           testing.TB
	sfx, dir     string
	bpffs        string // lbd's bpffs: it lives as long as the test, so a restart adopts its pins
	gen, lb      *testnet.NS
	genIf, upIf  string
	bes          []*testnet.NS
	lbIfs, beIfs []string
	beAddrs      []netip.Addr
	counters     []*xdpgen.Counter
	// pacer hears from the counters: a paced injector waits for arrivals.
	pacer *xdpgen.Pacer

	// lbd, when it runs.
	lbd     *testnet.Proc
	lbdAPI  lbdv1.LoadBalancerServiceClient
	lbdNode lbdv1.NodeServiceClient
	lbdArgs []string // lbd's command line, to restart it
	lbdSock string
}

// newRealPath builds the topology with no forwarder configured.
func newRealPath(tb testing.TB) *realPath {
	tb.Helper()
	testnet.Require(tb, "ip", "nsenter", "ethtool")
	if runtime.NumCPU() < 2 {
		tb.Skip("needs 2 CPUs: one for the LB node, one for the injector and backends")
	}
	sfx := testnet.Suffix(tb)
	// Interface names of at most 9 characters: a NAPI thread is named
	// "napi/<interface>-<id>" and a thread name is cut at 15.
	rp := &realPath{tb: tb, sfx: sfx, dir: tb.TempDir(), genIf: "rg" + sfx, upIf: "ru" + sfx}
	// Registered on the whole test, not on the subtest that starts lbd: lbd-no-guard
	// restarts it on the same pins, and whatever lbd mounts there is removed at the end.
	rp.bpffs = testnet.MountDir(tb)
	rp.gen = testnet.NewNS(tb, "lbdrp-"+sfx+"-gen")
	rp.lb = testnet.NewNS(tb, "lbdrp-"+sfx+"-lb")
	testnet.Veth(tb, testnet.VethEnd{NS: rp.gen, Name: rp.genIf, MAC: rpGenMAC},
		testnet.VethEnd{NS: rp.lb, Name: rp.upIf, MAC: rpUplinkMAC})
	rp.gen.AddAddr(tb, rp.genIf, rpGenAddr)
	var err error
	if rp.pacer, err = xdpgen.NewPacer(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { rp.pacer.Close() })
	rp.lb.AddAddr(tb, rp.upIf, rpUplink)
	for i := 1; i <= 2; i++ {
		be := testnet.NewNS(tb, fmt.Sprintf("lbdrp-%s-be%d", sfx, i))
		lbIf, beIf := fmt.Sprintf("r%d%s", i, sfx), fmt.Sprintf("b%d%s", i, sfx)
		testnet.Veth(tb, testnet.VethEnd{NS: rp.lb, Name: lbIf}, testnet.VethEnd{NS: be, Name: beIf})
		rp.lb.AddAddr(tb, lbIf, netip.MustParsePrefix(fmt.Sprintf("198.18.%d.1/24", 64+i)))
		addr := netip.MustParseAddr(fmt.Sprintf("198.18.%d.2", 64+i))
		be.AddAddr(tb, beIf, netip.PrefixFrom(addr, 24))
		rp.bes, rp.lbIfs, rp.beIfs, rp.beAddrs = append(rp.bes, be), append(rp.lbIfs, lbIf), append(rp.beIfs, beIf), append(rp.beAddrs, addr)
		c, err := rp.pacer.Count(be, beIf, true)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { c.Close() })
		rp.counters = append(rp.counters, c)
		// The counter made the veth poll with NAPI: move that off the LB node's CPU.
		rp.threadedNAPI(be, beIf, genCPU, rpPrioBackend)
	}
	// Forwarding on for every forwarder alike (lbd needs it for bpf_fib_lookup).
	rp.lb.Sysctl(tb, "net.ipv4.ip_forward=1", "net.ipv4.conf.all.forwarding=1")
	// Frames the injector sends out of a veth reach its peer only through the peer's
	// NAPI, which XDP or GRO enables. GRO, the kernel's default on real NICs, lets the
	// kernel and nftables forwarders run without any XDP program.
	rp.lb.Exec(tb, "ethtool", "-K", rp.upIf, "gro", "on")
	rp.threadedNAPI(rp.lb, rp.upIf, lbCPU, rpPrioLB)
	rp.gen.WaitUp(tb, rp.genIf)
	for i, be := range rp.bes {
		be.WaitUp(tb, rp.beIfs[i])
	}
	return rp
}

// threadedNAPI makes dev's NAPI poll in a kthread of its own, pinned to cpu, and
// SCHED_FIFO with priority prio. /sys/class/net shows the namespace of the process
// that mounted sysfs: `ip netns exec` mounts the namespace's own.
func (rp *realPath) threadedNAPI(ns *testnet.NS, dev string, cpu, prio int) {
	rp.tb.Helper()
	testnet.Run(rp.tb, "ip", "netns", "exec", ns.Name, "sh", "-c", "echo 1 > /sys/class/net/"+dev+"/threaded")
	pid := rp.napiThread(dev)
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(pid, &set); err != nil {
		rp.tb.Fatalf("pin NAPI thread of %s to CPU %d: %v", dev, cpu, err)
	}
	attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: uint32(prio)}
	if err := unix.SchedSetAttr(pid, &attr, 0); err != nil {
		rp.tb.Fatalf("make NAPI thread of %s SCHED_FIFO: %v", dev, err)
	}
}

// napiThread returns the PID of dev's NAPI kthread.
func (rp *realPath) napiThread(dev string) int {
	rp.tb.Helper()
	want := "napi/" + dev + "-"
	var found []int
	deadline := time.Now().Add(5 * time.Second)
	for len(found) == 0 {
		procs, err := os.ReadDir("/proc")
		if err != nil {
			rp.tb.Fatal(err)
		}
		for _, p := range procs {
			pid, err := strconv.Atoi(p.Name())
			if err != nil {
				continue
			}
			comm, err := os.ReadFile(filepath.Join("/proc", p.Name(), "comm"))
			if err == nil && strings.HasPrefix(strings.TrimSpace(string(comm)), want) {
				found = append(found, pid)
			}
		}
		if len(found) == 0 && time.Now().After(deadline) {
			rp.tb.Fatalf("no NAPI thread %s*", want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(found) != 1 {
		rp.tb.Fatalf("NAPI threads of %s: %v, want one (one queue)", dev, found)
	}
	return found[0]
}

// threadCPU returns the CPU time a thread has run, from /proc/PID/schedstat (in
// nanoseconds, unlike /proc/PID/stat's clock ticks).
func threadCPU(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	f := strings.Fields(string(b))
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		tb.Fatalf("schedstat of %d: %q", pid, b)
	}
	return time.Duration(ns)
}

// forwarded is the number of frames the backends counted.
func (rp *realPath) forwarded() uint64 {
	rp.tb.Helper()
	var n uint64
	for _, c := range rp.counters {
		p, _, err := c.Packets()
		if err != nil {
			rp.tb.Fatal(err)
		}
		n += p
	}
	return n
}

// perBackend is the number of frames each backend counted.
func (rp *realPath) perBackend() []uint64 {
	rp.tb.Helper()
	var out []uint64
	for _, c := range rp.counters {
		p, _, err := c.Packets()
		if err != nil {
			rp.tb.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// A forwarder configures the LB node to balance rpVIP:rpPort over the backends.
type forwarder struct {
	name  string
	setup func(rp *realPath)
	// teardown undoes setup, leaving the LB node as newRealPath left it.
	teardown func(rp *realPath)
}

var forwarders = []forwarder{
	{"kernel", (*realPath).kernelUp, (*realPath).kernelDown},
	{"nftables", (*realPath).nftUp, (*realPath).nftDown},
	{"lbd", (*realPath).lbdUp, nil},
	// The same lbd restarted with the flood guard off: every new flow is written into
	// conntrack, whatever the rate (by default, past 100,000 new flows a second per CPU,
	// new flows are balanced without an entry).
	{"lbd-no-guard", (*realPath).lbdNoGuardUp, nil},
}

// kernelUp routes the VIP over both backends (ECMP on addresses and ports): plain IP
// forwarding, no XDP, no netfilter.
func (rp *realPath) kernelUp() {
	rp.lb.Sysctl(rp.tb, "net.ipv4.fib_multipath_hash_policy=1")
	rp.lb.IP(rp.tb, fmt.Sprintf("route add %s/32 nexthop via %s dev %s nexthop via %s dev %s",
		rpVIP, rp.beAddrs[0], rp.lbIfs[0], rp.beAddrs[1], rp.lbIfs[1]))
}

func (rp *realPath) kernelDown() { rp.lb.IP(rp.tb, fmt.Sprintf("route del %s/32", rpVIP)) }

// nftUp is a DNAT load balancer: the VIP's new connections go to a backend chosen by a
// hash of the client address and port, as kube-proxy's nftables mode does with numgen;
// conntrack keeps each connection on its backend.
func (rp *realPath) nftUp() {
	rp.tb.Helper()
	rules := fmt.Sprintf(`table ip lbdrp {
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr %s tcp dport %d dnat to jhash ip saddr . tcp sport mod 2 map { 0 : %s, 1 : %s }
	}
}
`, rpVIP, rpPort, rp.beAddrs[0], rp.beAddrs[1])
	path := filepath.Join(rp.dir, "lbdrp.nft")
	if err := os.WriteFile(path, []byte(rules), 0o600); err != nil {
		rp.tb.Fatal(err)
	}
	rp.lb.Exec(rp.tb, "nft", "-f", path)
}

func (rp *realPath) nftDown() { rp.lb.Exec(rp.tb, "nft", "delete", "table", "ip", "lbdrp") }

// lbdUp runs the real lbd binary as the LB node's daemon, with one service over both
// backends created through its API, as an operator would. Its threads run on genCPU:
// the LB node's CPU is for forwarding.
// lbdNoGuardUp restarts lbd with the same datapath (it adopts its pinned maps and the
// service) and a configuration file that turns the flood guard off.
func (rp *realPath) lbdNoGuardUp() {
	t := rp.tb
	t.Helper()
	rp.lbd.Kill()
	lbdBin, _ := binaries(t)
	file := filepath.Join(rp.dir, "lbd", "no-guard.yaml")
	if err := os.WriteFile(file, []byte("datapath:\n  conntrack_guard_rate: 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rp.lbd = testnet.Start(t, "lbd", filepath.Join(rp.dir, "lbd", "lbd.log"),
		rp.lb.Command(append([]string{lbdBin, "--config", file}, rp.lbdArgs...)...))
	rp.dialLBD()
	rp.waitAttached()
	rp.waitReady()
}

// lbdUp starts lbd and creates the service.
func (rp *realPath) lbdUp() {
	t := rp.tb
	t.Helper()
	lbdBin, lbctlBin := binaries(t)
	dir := filepath.Join(rp.dir, "lbd")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "lbd.sock")
	rp.lbdArgs = []string{"--role", "lb", "--interface", rp.upIf, "--bpffs-dir", rp.bpffs,
		"--state-dir", filepath.Join(dir, "state"), "--socket", sock, "--hash-seed", hashSeed, "--log-level", "info"}
	rp.lbd = testnet.Start(t, "lbd", filepath.Join(dir, "lbd.log"), rp.lb.Command(append([]string{lbdBin}, rp.lbdArgs...)...))
	rp.lbdSock = sock
	rp.dialLBD()
	rp.waitAttached()
	args := []string{lbctlBin, "-s", "unix://" + sock, "service", "create", "web", "--vip", rpVIP.String(),
		"--port", fmt.Sprint(rpPort), "--protocol", "tcp"}
	for _, a := range rp.beAddrs {
		args = append(args, "--backend", netip.AddrPortFrom(a, rpPort).String())
	}
	testnet.Run(t, args...)
	rp.waitReady()
}

// dialLBD connects to lbd's API for the current (sub)test.
func (rp *realPath) dialLBD() {
	t := rp.tb
	t.Helper()
	conn, err := grpc.NewClient("unix://"+rp.lbdSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	rp.lbdNode = lbdv1.NewNodeServiceClient(conn)
	rp.lbdAPI = lbdv1.NewLoadBalancerServiceClient(conn)
}

// waitAttached waits for lbd's datapath to be attached and pins lbd away from the LB
// node's CPU.
func (rp *realPath) waitAttached() {
	t := rp.tb
	t.Helper()
	rp.waitFor(20*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := rp.lbdNode.GetNode(ctx, &lbdv1.GetNodeRequest{})
		if err == nil && !resp.GetNode().GetDatapathAttached() {
			err = fmt.Errorf("datapath not attached")
		}
		if err != nil && !rp.lbd.Running() {
			t.Fatalf("lbd exited:\n%s", rp.lbd.Tail(40))
		}
		return err
	})
	rp.pinProcess(rp.lbd.PID(), genCPU)
}

// waitReady waits for the service to be ready.
func (rp *realPath) waitReady() {
	rp.tb.Helper()
	rp.waitFor(10*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := rp.lbdAPI.GetService(ctx, &lbdv1.GetServiceRequest{Name: "web"})
		if err != nil {
			return err
		}
		if st := resp.GetService().GetStatus(); st.GetState() != lbdv1.ServiceState_SERVICE_STATE_READY {
			return fmt.Errorf("service web: %v: %s", st.GetState(), st.GetReason())
		}
		return nil
	})
}

// lbdPackets returns the packets lbd counted for the service.
func (rp *realPath) lbdPackets() (packets, newFlows uint64) {
	rp.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := rp.lbdAPI.GetStats(ctx, &lbdv1.GetStatsRequest{})
	if err != nil {
		rp.tb.Fatal(err)
	}
	for _, s := range resp.GetServices() {
		if s.GetServiceName() == "web" {
			return s.GetPackets(), s.GetNewFlows()
		}
	}
	rp.tb.Fatal("lbd has no stats for service web")
	return 0, 0
}

// lbdEvents returns lbd's conntrack event counts.
func (rp *realPath) lbdEvents() map[string]uint64 {
	rp.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := rp.lbdAPI.GetStats(ctx, &lbdv1.GetStatsRequest{})
	if err != nil {
		rp.tb.Fatal(err)
	}
	out := map[string]uint64{}
	for _, e := range resp.GetConntrackEvents() {
		out[e.GetName()] = e.GetCount()
	}
	return out
}

// pinProcess pins every thread of a process to cpu (threads it starts later inherit).
func (rp *realPath) pinProcess(pid, cpu int) {
	rp.tb.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		rp.tb.Fatal(err)
	}
	var set unix.CPUSet
	set.Set(cpu)
	for _, task := range tasks {
		tid, _ := strconv.Atoi(task.Name())
		if err := unix.SchedSetaffinity(tid, &set); err != nil {
			rp.tb.Fatalf("pin thread %d of %d: %v", tid, pid, err)
		}
	}
}

func (rp *realPath) waitFor(timeout time.Duration, fn func() error) {
	rp.tb.Helper()
	eventually(rp.tb, timeout, fn)
}

// A traffic case: which frames the injector sends.
type trafficCase struct {
	name string
	cfg  xdpgen.Config
}

// rpFrame is a 64-byte TCP frame from the injector to the VIP.
func rpFrame(flags pktgen.TCPFlags) []byte {
	return pktgen.Packet{SrcMAC: rpGenMAC, DstMAC: rpUplinkMAC, Src: rpClients, Dst: rpVIP,
		SrcPort: rpFirstPt, DstPort: rpPort, Flags: flags, Payload: pktgen.Bytes(rpFrameLen - 54)}.Frame()
}

// trafficCases are "few flows": rpFewFlows established connections' ACKs, each
// forwarder picking them up mid-stream (the kernel's conntrack marks an ACK after a
// SYN of which it never saw the answer invalid); and "new flow per packet": every
// frame a SYN of a new connection.
func trafficCases() []trafficCase {
	return []trafficCase{
		{"few_flows", xdpgen.Config{Frame: rpFrame(pktgen.ACK), Mode: xdpgen.NewFlow, Sources: rpFewFlows}},
		{"new_flow_per_packet", xdpgen.Config{Frame: rpFrame(pktgen.SYN), Mode: xdpgen.NewFlow, Sources: rpSources,
			Ports: rpPorts}},
	}
}

// sample is one measurement of a forwarder.
type sample struct {
	sent, forwarded uint64
	dur             time.Duration // from the injector's first frame to its last
	lbCPU           time.Duration // the LB node's NAPI thread's CPU time meanwhile
}

func (s sample) offeredPPS() float64 { return float64(s.sent) / s.dur.Seconds() }
func (s sample) pps() float64        { return float64(s.forwarded) / s.dur.Seconds() }
func (s sample) nsPerPkt() float64   { return float64(s.lbCPU.Nanoseconds()) / float64(s.forwarded) }

// measure sends n frames and counts what the backends got. Paced, the injector keeps
// at most rpWindow frames in flight, so that every frame must be forwarded; unpaced,
// it sends as fast as it can and the LB node forwards what it can (the rest overflows
// its uplink's ring).
func (rp *realPath) measure(g *xdpgen.Gen, n int, paced bool) sample {
	rp.tb.Helper()
	window := 0
	if paced {
		window = rpWindow
	}
	if err := g.SetWindow(window); err != nil {
		rp.tb.Fatal(err)
	}
	pid := rp.napiThread(rp.upIf)
	fw0, cpu0 := rp.forwarded(), threadCPU(rp.tb, pid)
	sent, d, err := g.Send(rp.gen, rp.genIf, n)
	if err != nil {
		rp.tb.Fatal(err)
	}
	want := ^uint64(0)
	if paced {
		want = fw0 + uint64(sent)
	}
	rp.settle(want)
	return sample{sent: uint64(sent), dur: d, forwarded: rp.forwarded() - fw0, lbCPU: threadCPU(rp.tb, pid) - cpu0}
}

// rpWindow is a paced injector's frames in flight: half the LB node's veth ring.
const rpWindow = 128

// settle waits until the backends counted want frames, or counted nothing new for
// 100 ms.
func (rp *realPath) settle(want uint64) {
	rp.tb.Helper()
	last, idle := rp.forwarded(), time.Now()
	for last < want && time.Since(idle) < 100*time.Millisecond {
		time.Sleep(200 * time.Microsecond)
		if n := rp.forwarded(); n != last {
			last, idle = n, time.Now()
		}
	}
}
