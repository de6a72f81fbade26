//go:build linux

package integration

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Addresses (DESIGN.md §7): nodes in 198.18.0.0/15, VIPs in 203.0.113.0/24, IPv6 in
// 2001:db8::/32. Every address lives only in the namespaces of one testbed.
var (
	vip4 = netip.MustParseAddr("203.0.113.10")
	vip6 = netip.MustParseAddr("2001:db8:5::10")

	client4       = netip.MustParseAddr("198.19.1.2")
	client6       = netip.MustParseAddr("2001:db8:1::2")
	routerClient4 = netip.MustParseAddr("198.19.1.1")
	routerClient6 = netip.MustParseAddr("2001:db8:1::1")
	routerFabric4 = netip.MustParseAddr("198.18.0.1")
	routerFabric6 = netip.MustParseAddr("2001:db8:f::1")
	fabric4       = netip.MustParsePrefix("198.18.0.0/24")
	fabric6       = netip.MustParsePrefix("2001:db8:f::/64")
)

// Service ports on the VIPs; each maps to the server port of the same kind.
const (
	webPort  = 80   // TCP, to httpPort
	streamPt = 9000 // TCP, to echoPort
	dnsPort  = 5300 // UDP, to udpPort
)

// options shape a testbed; the zero value is the default topology.
type options struct {
	lbs, backends int // default 2 and 3
	// fabricMTU of every fabric link (default 1600, room for the 62-byte encapsulation).
	fabricMTU int
	// noAdvmss lets backends advertise the MSS of their fabric MTU, so a client
	// behind a 1500-byte link sends packets that no longer fit once encapsulated.
	noAdvmss bool
	// conntrackSize of the LB daemons; 0 keeps lbd's default.
	conntrackSize int
	// staticRoutes gives the router static VIP routes over every LB node instead of
	// BGP sessions with the LB daemons: for a testbed that runs no lbd.
	staticRoutes bool
	// noGracefulRestart leaves graceful restart off on the LB daemons' BGP sessions:
	// the router then drops a node's routes as soon as its session ends.
	noGracefulRestart bool
	// socketLB gives the first backend node's lbd socket-level load balancing for the
	// processes of a cgroup the testbed creates (testbed.cgroup).
	socketLB bool
}

// node is an LB or backend node: a namespace with one uplink into the fabric bridge.
type node struct {
	name         string // "lb1", "be2": also what a backend's servers answer with
	ns           string
	ifc, brIfc   string // uplink, and its peer on the bridge
	mac          net.HardwareAddr
	addr4, addr6 netip.Addr
	lbd          *daemon
	servers      *proc // a backend node's servers
}

// testbed is one topology:
//
//	client ─ router (BIRD, ECMP over the LB nodes) ─ fabric bridge ─ LB nodes
//	                                                              └─ backend nodes
//
// The LB daemons announce their VIPs to the router over BGP. LB nodes send Geneve to
// the backend nodes over the bridge; backends answer the client straight through the
// router.
type testbed struct {
	t    *testing.T
	opts options
	sfx  string
	dir  string // sockets, state and logs

	clientNS, routerNS, bridgeNS string
	clientIf, routerCIf          string // the client link, client and router side
	routerFIf, routerFBr         string // the router's fabric link and its bridge port
	bridge                       string
	lbs, backends                []*node

	bpffs       string // base bpffs directory, one subdirectory per node
	cgroup      string // cgroup v2 directory of socket-level load balancing (options.socketLB)
	lbdBin      string
	lbctlBin    string
	router      *bird
	clientPorts atomic.Uint32
}

func newSuffix(t *testing.T) string {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// newTestbed builds the network, starts the router and the backend servers. LB and
// backend daemons are started by startLBD; with BGP, the router has no VIP route
// before. Everything is removed when the test ends,
// whether it passed or not: processes first (by PID), then pins, then namespaces.
func newTestbed(t *testing.T, opts options) *testbed {
	t.Helper()
	requireEnv(t)
	if opts.lbs == 0 {
		opts.lbs = 2
	}
	if opts.backends == 0 {
		opts.backends = 3
	}
	if opts.fabricMTU == 0 {
		opts.fabricMTU = 1600
	}
	sfx := newSuffix(t)
	tb := &testbed{
		t: t, opts: opts, sfx: sfx,
		clientNS: "lbdit-" + sfx + "-cl", routerNS: "lbdit-" + sfx + "-rt", bridgeNS: "lbdit-" + sfx + "-br",
		clientIf: "cl-" + sfx, routerCIf: "rc-" + sfx, routerFIf: "rf-" + sfx, routerFBr: "brf-" + sfx,
		bridge: "br-" + sfx,
	}
	tb.dir = filepath.Join(os.TempDir(), "lbd-it-"+sfx)
	if err := os.MkdirAll(tb.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tb.dir) })
	tb.clientPorts.Store(10000)

	for i := 1; i <= opts.lbs; i++ {
		tb.lbs = append(tb.lbs, tb.newNode(fmt.Sprintf("lb%d", i), 1, i))
	}
	for i := 1; i <= opts.backends; i++ {
		tb.backends = append(tb.backends, tb.newNode(fmt.Sprintf("be%d", i), 2, i))
	}

	namespaces := []string{tb.clientNS, tb.routerNS, tb.bridgeNS}
	for _, n := range tb.nodes() {
		namespaces = append(namespaces, n.ns)
	}
	t.Cleanup(func() {
		for _, ns := range namespaces {
			bestEffort("ip", "netns", "delete", ns)
		}
	})
	for _, ns := range namespaces {
		run(t, "ip", "netns", "add", ns)
	}
	tb.setupBPFFS()
	if opts.socketLB {
		tb.setupCgroup()
	}
	tb.setupLinks()
	tb.setupAddresses()
	tb.setupKernel()
	tb.attachPeerXDP()
	tb.router = tb.startRouter(tb.lbs)
	for _, be := range tb.backends {
		tb.startServers(be)
	}
	return tb
}

// bestEffort runs a cleanup command whose failure is not worth reporting (the namespace
// may already be gone).
func bestEffort(args ...string) { runErr(args...) }

func (tb *testbed) newNode(name string, role, i int) *node {
	host := 10*role + i // lb1 .11, be1 .21
	return &node{
		name:  name,
		ns:    "lbdit-" + tb.sfx + "-" + name,
		ifc:   name + "-" + tb.sfx,
		brIfc: "b" + name + "-" + tb.sfx,
		mac:   net.HardwareAddr{0x02, 0, 0, 0, byte(role), byte(i)},
		addr4: netip.MustParseAddr(fmt.Sprintf("198.18.0.%d", host)),
		addr6: netip.MustParseAddr(fmt.Sprintf("2001:db8:f::%d", host)),
	}
}

func (tb *testbed) nodes() []*node { return append(append([]*node{}, tb.lbs...), tb.backends...) }

// setupBPFFS picks the base directory of the daemons' pins: below /sys/fs/bpf when it
// is a bpffs, else a bpffs that the test mounts itself (this machine has none).
func (tb *testbed) setupBPFFS() {
	t := tb.t
	var st unix.Statfs_t
	if unix.Statfs("/sys/fs/bpf", &st) == nil && st.Type == unix.BPF_FS_MAGIC {
		tb.bpffs = "/sys/fs/bpf/lbd-test-" + tb.sfx
		if err := os.Mkdir(tb.bpffs, 0o700); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(tb.bpffs) })
	} else {
		tb.bpffs = filepath.Join(os.TempDir(), "lbd-test-bpffs-"+tb.sfx)
		if err := os.Mkdir(tb.bpffs, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("bpf", tb.bpffs, "bpf", 0, "mode=0700"); err != nil {
			os.Remove(tb.bpffs)
			t.Fatalf("mount bpffs on %s: %v", tb.bpffs, err)
		}
		t.Cleanup(func() {
			entries, _ := os.ReadDir(tb.bpffs)
			for _, e := range entries {
				os.RemoveAll(filepath.Join(tb.bpffs, e.Name()))
			}
			if err := unix.Unmount(tb.bpffs, 0); err != nil {
				t.Errorf("unmount %s: %v", tb.bpffs, err)
			}
			os.Remove(tb.bpffs)
		})
	}
	for _, n := range tb.nodes() {
		if err := os.Mkdir(filepath.Join(tb.bpffs, n.name), 0o700); err != nil {
			t.Fatal(err)
		}
	}
}

func (tb *testbed) setupLinks() {
	mtu := fmt.Sprint(tb.opts.fabricMTU)
	lines := []string{
		fmt.Sprintf("link add %s netns %s type veth peer name %s netns %s", tb.clientIf, tb.clientNS, tb.routerCIf, tb.routerNS),
		fmt.Sprintf("link add %s mtu %s netns %s type veth peer name %s mtu %s netns %s",
			tb.routerFIf, mtu, tb.routerNS, tb.routerFBr, mtu, tb.bridgeNS),
	}
	for _, n := range tb.nodes() {
		lines = append(lines, fmt.Sprintf("link add %s mtu %s address %s netns %s type veth peer name %s mtu %s netns %s",
			n.ifc, mtu, n.mac, n.ns, n.brIfc, mtu, tb.bridgeNS))
	}
	ipBatch(tb.t, "", lines...)

	br := []string{fmt.Sprintf("link add %s type bridge mcast_snooping 0", tb.bridge), "link set " + tb.bridge + " up"}
	for _, p := range append([]string{tb.routerFBr}, tb.brPorts()...) {
		br = append(br, fmt.Sprintf("link set %s master %s", p, tb.bridge), "link set "+p+" up")
	}
	ipBatch(tb.t, tb.bridgeNS, br...)
}

func (tb *testbed) brPorts() []string {
	var out []string
	for _, n := range tb.nodes() {
		out = append(out, n.brIfc)
	}
	return out
}

func (tb *testbed) setupAddresses() {
	t := tb.t
	ipBatch(t, tb.clientNS,
		"link set lo up",
		fmt.Sprintf("addr add %s/24 dev %s", client4, tb.clientIf),
		fmt.Sprintf("addr add %s/64 dev %s nodad", client6, tb.clientIf),
		"link set "+tb.clientIf+" up",
		fmt.Sprintf("route add default via %s", routerClient4),
		fmt.Sprintf("route add ::/0 via %s", routerClient6))
	ipBatch(t, tb.routerNS,
		"link set lo up",
		fmt.Sprintf("addr add %s/24 dev %s", routerClient4, tb.routerCIf),
		fmt.Sprintf("addr add %s/64 dev %s nodad", routerClient6, tb.routerCIf),
		fmt.Sprintf("addr add %s/%d dev %s", routerFabric4, fabric4.Bits(), tb.routerFIf),
		fmt.Sprintf("addr add %s/%d dev %s nodad", routerFabric6, fabric6.Bits(), tb.routerFIf),
		"link set "+tb.routerCIf+" up",
		"link set "+tb.routerFIf+" up")
	for _, n := range tb.nodes() {
		lines := []string{
			"link set lo up",
			fmt.Sprintf("addr add %s/%d dev %s", n.addr4, fabric4.Bits(), n.ifc),
			fmt.Sprintf("addr add %s/%d dev %s nodad", n.addr6, fabric6.Bits(), n.ifc),
			"link set " + n.ifc + " up",
		}
		if strings.HasPrefix(n.name, "be") {
			// Backends answer clients straight through the router (DSR). advmss keeps
			// client segments at what the client's own 1500-byte link carries.
			adv4, adv6 := " advmss 1460", " advmss 1440"
			if tb.opts.noAdvmss {
				adv4, adv6 = "", ""
			}
			lines = append(lines,
				fmt.Sprintf("route add default via %s%s", routerFabric4, adv4),
				fmt.Sprintf("route add ::/0 via %s%s", routerFabric6, adv6))
		} else {
			// bpf_fib_lookup in XDP does not resolve neighbours: the LB node needs
			// entries for every backend node it sends to.
			for _, be := range tb.backends {
				lines = append(lines,
					fmt.Sprintf("neigh replace %s lladdr %s dev %s nud permanent", be.addr4, be.mac, n.ifc),
					fmt.Sprintf("neigh replace %s lladdr %s dev %s nud permanent", be.addr6, be.mac, n.ifc))
			}
		}
		ipBatch(t, n.ns, lines...)
	}
}

// setupKernel applies the sysctls and offload settings of TESTBED.md.
func (tb *testbed) setupKernel() {
	t := tb.t
	// Policy 3 with these fields hashes on addresses, protocol and ports only: the
	// path of a flow is repeatable, unlike policy 1 on veth.
	nsExec(t, tb.routerNS, "sysctl", "-qw",
		"net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1",
		"net.ipv4.fib_multipath_hash_policy=3", "net.ipv4.fib_multipath_hash_fields=0x0037",
		"net.ipv6.fib_multipath_hash_policy=3", "net.ipv6.fib_multipath_hash_fields=0x0037")
	for _, lb := range tb.lbs {
		// bpf_fib_lookup needs forwarding on the ingress device. LB nodes have no
		// default route, so traffic XDP passes up cannot loop back to the router.
		nsExec(t, lb.ns, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	}
	// Sockets on veth leave checksums to the device (CHECKSUM_PARTIAL), which native
	// XDP and a SNAT that forgets the pseudo-header would hide: senders compute them.
	nsExec(t, tb.clientNS, "ethtool", "-K", tb.clientIf, "tx", "off")
	for _, be := range tb.backends {
		nsExec(t, be.ns, "ethtool", "-K", be.ifc, "tx", "off")
	}
}

// attachPeerXDP gives the bridge side of every LB uplink an XDP_PASS program: frames an
// LB sends with XDP_TX are dropped unless the veth peer runs XDP (TESTBED.md).
func (tb *testbed) attachPeerXDP() {
	t := tb.t
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:    "xdp_pass",
		Type:    ebpf.XDP,
		License: "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, 2), // XDP_PASS
			asm.Return(),
		},
	})
	if err != nil {
		t.Fatalf("load XDP_PASS program: %v", err)
	}
	t.Cleanup(func() { prog.Close() })
	for _, lb := range tb.lbs {
		idx := ifindex(t, tb.bridgeNS, lb.brIfc)
		var l link.Link
		err := inNS(tb.bridgeNS, func() error {
			var err error
			l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: idx, Flags: link.XDPDriverMode})
			return err
		})
		if err != nil {
			t.Fatalf("attach XDP_PASS to %s: %v", lb.brIfc, err)
		}
		t.Cleanup(func() { l.Close() })
	}
}

// nextClientPort hands out client ports: reusing a 4-tuple still in TIME_WAIT makes
// connections fail at random (TESTBED.md), and distinct ports spread over ECMP paths.
func (tb *testbed) nextClientPort() int {
	p := tb.clientPorts.Add(1)
	if p > 32000 {
		tb.t.Fatal("out of client ports")
	}
	return int(p)
}

// backendByName returns a backend node by the name its servers answer with.
func (tb *testbed) backendByName(name string) (*node, error) {
	for _, be := range tb.backends {
		if be.name == name {
			return be, nil
		}
	}
	return nil, errors.New("no backend named " + name)
}
