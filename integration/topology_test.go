//go:build linux

package integration

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/etcdtest"
	"github.com/lbd-dev/lbd/internal/testnet"
	"golang.org/x/sys/unix"
)

// Service ports on the VIPs; each maps to the server port of the same kind.
const (
	webPort  = 80   // TCP, to httpPort
	streamPt = 9000 // TCP, to echoPort
	dnsPort  = 5300 // UDP, to udpPort
)

// Addresses (docs/testing.md, "Address plan"): nodes in 198.18.0.0/15, VIPs in 203.0.113.0/24, IPv6 in
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
	// backnet4 and backnet6 are the second link of options.backendLink.
	backnet4 = netip.MustParsePrefix("198.18.2.0/24")
	backnet6 = netip.MustParsePrefix("2001:db8:b::/64")
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
	// backendLink gives every node a second link into a backend network (backnet4,
	// backnet6, its own bridge): LB nodes take client traffic on the fabric and send
	// Geneve over the second link, and backend nodes accept Geneve only from there.
	backendLink bool
	// verifyInterval is the LB daemons' datapath.verify_interval; 0 keeps lbd's.
	verifyInterval time.Duration
	// datapathYAML adds settings to every daemon's datapath section (", key: value").
	datapathYAML string
	// keepalive makes the backend servers probe idle echo connections this often.
	keepalive time.Duration
	// etcd puts the LB daemons on the etcd store (fleet_test.go): a member in each LB
	// node's namespace; services are created through the first LB node only.
	etcd bool
}

// node is an LB or backend node: a namespace with one uplink into the fabric bridge.
type node struct {
	name         string // "lb1", "be2": also what a backend's servers answer with
	ns           *testnet.NS
	ifc, brIfc   string // uplink, and its peer on the bridge
	mac          net.HardwareAddr
	addr4, addr6 netip.Addr
	// The second link of options.backendLink, its bridge port and addresses.
	backIfc, backBrIfc   string
	backAddr4, backAddr6 netip.Addr
	lbd                  *daemon
	servers              *testnet.Proc // a backend node's servers
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

	clientNS, routerNS, bridgeNS *testnet.NS
	clientIf, routerCIf          string // the client link, client and router side
	routerFIf, routerFBr         string // the router's fabric link and its bridge port
	bridge                       string
	backBridge                   string // the backend network's bridge (options.backendLink)
	lbs, backends                []*node

	bpffs       string // base bpffs directory, one subdirectory per node
	cgroup      string // cgroup v2 directory of socket-level load balancing (options.socketLB)
	lbdBin      string
	lbctlBin    string
	router      *bird
	clientPorts atomic.Uint32
	etcd        *etcdtest.Cluster // options.etcd
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
	sfx := testnet.Suffix(t)
	tb := &testbed{
		t: t, opts: opts, sfx: sfx,
		clientIf: "cl-" + sfx, routerCIf: "rc-" + sfx, routerFIf: "rf-" + sfx, routerFBr: "brf-" + sfx,
		bridge: "br-" + sfx, backBridge: "bb-" + sfx,
	}
	tb.dir = filepath.Join(os.TempDir(), "lbd-it-"+sfx)
	if err := os.MkdirAll(tb.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tb.dir) })
	tb.clientPorts.Store(10000)

	tb.clientNS = testnet.NewNS(t, "lbdit-"+sfx+"-cl")
	tb.routerNS = testnet.NewNS(t, "lbdit-"+sfx+"-rt")
	tb.bridgeNS = testnet.NewNS(t, "lbdit-"+sfx+"-br")
	for i := 1; i <= opts.lbs; i++ {
		tb.lbs = append(tb.lbs, tb.newNode(fmt.Sprintf("lb%d", i), 1, i))
	}
	for i := 1; i <= opts.backends; i++ {
		tb.backends = append(tb.backends, tb.newNode(fmt.Sprintf("be%d", i), 2, i))
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

func (tb *testbed) newNode(name string, role, i int) *node {
	host := 10*role + i // lb1 .11, be1 .21
	return &node{
		name:      name,
		ns:        testnet.NewNS(tb.t, "lbdit-"+tb.sfx+"-"+name),
		ifc:       name + "-" + tb.sfx,
		brIfc:     "b" + name + "-" + tb.sfx,
		mac:       net.HardwareAddr{0x02, 0, 0, 0, byte(role), byte(i)},
		addr4:     netip.MustParseAddr(fmt.Sprintf("198.18.0.%d", host)),
		addr6:     netip.MustParseAddr(fmt.Sprintf("2001:db8:f::%d", host)),
		backIfc:   name + "k-" + tb.sfx,
		backBrIfc: "k" + name + "-" + tb.sfx,
		backAddr4: netip.MustParseAddr(fmt.Sprintf("198.18.2.%d", host)),
		backAddr6: netip.MustParseAddr(fmt.Sprintf("2001:db8:b::%d", host)),
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
		tb.bpffs = testnet.BPFFS(t)
	}
	for _, n := range tb.nodes() {
		if err := os.Mkdir(filepath.Join(tb.bpffs, n.name), 0o700); err != nil {
			t.Fatal(err)
		}
	}
}

func (tb *testbed) setupLinks() {
	t, mtu := tb.t, tb.opts.fabricMTU
	testnet.Veth(t, testnet.VethEnd{NS: tb.clientNS, Name: tb.clientIf}, testnet.VethEnd{NS: tb.routerNS, Name: tb.routerCIf})
	testnet.Veth(t, testnet.VethEnd{NS: tb.routerNS, Name: tb.routerFIf, MTU: mtu},
		testnet.VethEnd{NS: tb.bridgeNS, Name: tb.routerFBr, MTU: mtu})
	for _, n := range tb.nodes() {
		testnet.Veth(t, testnet.VethEnd{NS: n.ns, Name: n.ifc, MTU: mtu, MAC: n.mac},
			testnet.VethEnd{NS: tb.bridgeNS, Name: n.brIfc, MTU: mtu})
	}
	br := []string{fmt.Sprintf("link add %s type bridge mcast_snooping 0", tb.bridge), "link set " + tb.bridge + " up"}
	for _, p := range append([]string{tb.routerFBr}, tb.brPorts()...) {
		br = append(br, fmt.Sprintf("link set %s master %s", p, tb.bridge))
	}
	if tb.opts.backendLink {
		br = append(br, fmt.Sprintf("link add %s type bridge mcast_snooping 0", tb.backBridge), "link set "+tb.backBridge+" up")
		for _, n := range tb.nodes() {
			testnet.Veth(t, testnet.VethEnd{NS: n.ns, Name: n.backIfc, MTU: mtu},
				testnet.VethEnd{NS: tb.bridgeNS, Name: n.backBrIfc, MTU: mtu})
			br = append(br, fmt.Sprintf("link set %s master %s", n.backBrIfc, tb.backBridge))
		}
	}
	tb.bridgeNS.IP(t, br...)
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
	tb.clientNS.AddAddr(t, tb.clientIf, netip.PrefixFrom(client4, 24), netip.PrefixFrom(client6, 64))
	tb.clientNS.IP(t,
		fmt.Sprintf("route add default via %s", routerClient4),
		fmt.Sprintf("route add ::/0 via %s", routerClient6))
	tb.routerNS.AddAddr(t, tb.routerCIf, netip.PrefixFrom(routerClient4, 24), netip.PrefixFrom(routerClient6, 64))
	tb.routerNS.AddAddr(t, tb.routerFIf, netip.PrefixFrom(routerFabric4, fabric4.Bits()), netip.PrefixFrom(routerFabric6, fabric6.Bits()))
	for _, n := range tb.nodes() {
		n.ns.AddAddr(t, n.ifc, netip.PrefixFrom(n.addr4, fabric4.Bits()), netip.PrefixFrom(n.addr6, fabric6.Bits()))
		if tb.opts.backendLink {
			n.ns.AddAddr(t, n.backIfc, netip.PrefixFrom(n.backAddr4, backnet4.Bits()), netip.PrefixFrom(n.backAddr6, backnet6.Bits()))
		}
		var lines []string
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
			// LB nodes have a default route, as real hosts do: VIP traffic the kernel
			// got would go back to the router (lbd must never hand it any).
			lines = append(lines,
				fmt.Sprintf("route add default via %s", routerFabric4),
				fmt.Sprintf("route add ::/0 via %s", routerFabric6))
		}
		// LB nodes get no neighbour entry for the backend nodes, as on a freshly booted
		// host: lbd resolves and keeps its next hops itself.
		if len(lines) > 0 {
			n.ns.IP(t, lines...)
		}
	}
}

// setupKernel applies the sysctls and offload settings of docs/testing.md.
func (tb *testbed) setupKernel() {
	t := tb.t
	// Policy 3 with these fields hashes on addresses, protocol and ports only: the
	// path of a flow is repeatable, unlike policy 1 on veth.
	tb.routerNS.Sysctl(t,
		"net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1",
		"net.ipv4.fib_multipath_hash_policy=3", "net.ipv4.fib_multipath_hash_fields=0x0037",
		"net.ipv6.fib_multipath_hash_policy=3", "net.ipv6.fib_multipath_hash_fields=0x0037")
	// LB nodes keep the kernel's defaults (forwarding off): lbd turns on what its
	// datapath needs on its own interfaces.
	// Sockets on veth leave checksums to the device (CHECKSUM_PARTIAL), which native
	// XDP and a SNAT that forgets the pseudo-header would hide: senders compute them.
	tb.clientNS.Exec(t, "ethtool", "-K", tb.clientIf, "tx", "off")
	for _, be := range tb.backends {
		be.ns.Exec(t, "ethtool", "-K", be.ifc, "tx", "off")
		if tb.opts.backendLink {
			be.ns.Exec(t, "ethtool", "-K", be.backIfc, "tx", "off")
		}
	}
}

// attachPeerXDP gives the bridge side of every LB uplink an XDP_PASS program: frames an
// LB sends with XDP_TX are dropped unless the veth peer runs XDP (docs/testing.md).
func (tb *testbed) attachPeerXDP() {
	for _, lb := range tb.lbs {
		tb.bridgeNS.PassXDP(tb.t, lb.brIfc)
		if tb.opts.backendLink {
			// XDP_REDIRECT into the second link needs the same on its peer.
			tb.bridgeNS.PassXDP(tb.t, lb.backBrIfc)
		}
	}
}

// nextClientPort hands out client ports: reusing a 4-tuple still in TIME_WAIT makes
// connections fail at random (docs/testing.md), and distinct ports spread over ECMP paths.
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
