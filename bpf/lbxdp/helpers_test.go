//go:build linux

package lbxdp

import (
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/lbd-dev/lbd/internal/testnet"
)

// Addresses of the test topology (one network namespace per test):
//
//	lbA (ingress, 198.18.0.1/24, 2001:db8::1/64) — neighbour .2 / ::2 (nhMAC)
//	    routes: backend nodes 198.18.10.0/24, 2001:db8:10::/64      → XDP_TX
//	            198.18.12.0/24, 2001:db8:12::/64 with MTU 1400 (locked: the FIB only honours locked route MTUs) → too big
//	            198.18.13.0/24 via a neighbour that does not exist   → FIB failure
//	            198.18.14.0/24 unreachable                           → FIB failure
//	lbC (198.18.1.1/24, 2001:db8:1::1/64) — neighbour .2 / ::2 (nh2MAC)
//	    routes: backend nodes 198.18.11.0/24, 2001:db8:11::/64      → XDP_REDIRECT
var (
	nhMAC     = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}
	nh2MAC    = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x03}
	clientMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x10}

	src4 = netip.MustParseAddr("198.18.0.1")
	src6 = netip.MustParseAddr("2001:db8::1")

	vip4  = netip.MustParseAddr("203.0.113.10")
	vip4b = netip.MustParseAddr("203.0.113.11")
	vip6  = netip.MustParseAddr("2001:db8:f00::10")

	client4 = netip.MustParseAddr("198.18.200.7")
	client6 = netip.MustParseAddr("2001:db8:200::7")
)

// topo is a network namespace in which the FIB lookups of test runs resolve.
type topo struct {
	ns   *testnet.NS
	devA string // lbA's name
	ifA  int
	ifC  int
	macA net.HardwareAddr
	macC net.HardwareAddr
}

func newTopo(tb testing.TB) *topo {
	tb.Helper()
	sfx := testnet.Suffix(tb)
	ns := testnet.NewNS(tb, "lbx-"+sfx)
	a, b, c, d := "lxa"+sfx, "lxb"+sfx, "lxc"+sfx, "lxd"+sfx
	testnet.Veth(tb, testnet.VethEnd{NS: ns, Name: a}, testnet.VethEnd{NS: ns, Name: b})
	testnet.Veth(tb, testnet.VethEnd{NS: ns, Name: c}, testnet.VethEnd{NS: ns, Name: d})
	ns.AddAddr(tb, a, netip.MustParsePrefix("198.18.0.1/24"), netip.MustParsePrefix("2001:db8::1/64"))
	ns.AddAddr(tb, c, netip.MustParsePrefix("198.18.1.1/24"), netip.MustParsePrefix("2001:db8:1::1/64"))
	ns.IP(tb,
		"neigh add 198.18.0.2 lladdr "+nhMAC.String()+" dev "+a+" nud permanent",
		"neigh add 2001:db8::2 lladdr "+nhMAC.String()+" dev "+a+" nud permanent",
		"neigh add 198.18.1.2 lladdr "+nh2MAC.String()+" dev "+c+" nud permanent",
		"neigh add 2001:db8:1::2 lladdr "+nh2MAC.String()+" dev "+c+" nud permanent",
		"route add 198.18.10.0/24 via 198.18.0.2 dev "+a,
		"route add 2001:db8:10::/64 via 2001:db8::2 dev "+a,
		"route add 198.18.11.0/24 via 198.18.1.2 dev "+c,
		"route add 2001:db8:11::/64 via 2001:db8:1::2 dev "+c,
		"route add 198.18.12.0/24 via 198.18.0.2 dev "+a+" mtu lock 1400",
		"route add 2001:db8:12::/64 via 2001:db8::2 dev "+a+" mtu lock 1400",
		"route add 198.18.13.0/24 via 198.18.0.3 dev "+a,
		"route add unreachable 198.18.14.0/24")
	// bpf_fib_lookup refuses to forward from a device without forwarding.
	ns.Sysctl(tb, "net.ipv4.conf.all.forwarding=1", "net.ipv6.conf.all.forwarding=1")
	la, lc := ns.Interface(tb, a), ns.Interface(tb, c)
	return &topo{ns: ns, devA: a, ifA: la.Index, macA: la.HardwareAddr, ifC: lc.Index, macC: lc.HardwareAddr}
}

// env is a loaded datapath inside a topology, with a default configuration.
type env struct {
	*topo
	d *Datapath
}

func newEnv(tb testing.TB) *env {
	tb.Helper()
	return newEnvWith(tb, Options{ConntrackSize: 65536, MaxBackends: 1024, MaxServices: 256})
}

func newEnvWith(tb testing.TB, opts Options) *env {
	tb.Helper()
	t := newTopo(tb)
	return &env{topo: t, d: loadDatapath(tb, opts)}
}

func loadDatapath(tb testing.TB, opts Options) *Datapath {
	tb.Helper()
	d, err := Load(opts)
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			tb.Fatalf("%+v", ve)
		}
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d.Close() })
	cfg := DefaultConfig()
	cfg.HashSeed = 0x5eed
	cfg.Source4 = src4
	cfg.Source6 = src6
	if err := d.SetConfig(cfg); err != nil {
		tb.Fatal(err)
	}
	return d
}

// Common service setup: one TCP and one UDP service per VIP, with backends
// on the XDP_TX node subnet.
type svcSetup struct {
	key      ServiceKey
	svc      Service
	backends []uint32
}

func (e *env) addService(tb testing.TB, s svcSetup) {
	tb.Helper()
	if err := e.d.UpsertService(s.key, s.svc); err != nil {
		tb.Fatal(err)
	}
	if len(s.backends) > 0 {
		e.setTable(tb, s.svc.ID, s.backends, 31)
	}
}

// setTable fills a table of size m round-robin over backends.
func (e *env) setTable(tb testing.TB, id uint32, backends []uint32, m int) {
	tb.Helper()
	table := make([]uint32, m)
	for i := range table {
		table[i] = backends[i%len(backends)]
	}
	if err := e.d.SetMaglevTable(id, table); err != nil {
		tb.Fatal(err)
	}
}

func (e *env) addBackend(tb testing.TB, id uint32, addr string, port uint16, node string) {
	tb.Helper()
	if err := e.d.UpsertBackend(id, Backend{Addr: netip.MustParseAddr(addr), Port: port, Node: netip.MustParseAddr(node)}); err != nil {
		tb.Fatal(err)
	}
}

func (e *env) drops(tb testing.TB) map[DropReason]Counters {
	tb.Helper()
	c, err := e.d.DropCounters()
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// expectDrop runs frame and checks it was dropped and counted under reason.
func (e *env) expectDrop(tb testing.TB, frame []byte, reason DropReason) {
	tb.Helper()
	before := e.drops(tb)[reason].Packets
	v, _ := e.run(tb, frame)
	if v != XDPDrop {
		tb.Fatalf("verdict %v, want XDP_DROP", v)
	}
	if after := e.drops(tb)[reason].Packets; after != before+1 {
		tb.Fatalf("drop counter %v: %d -> %d, want +1", reason, before, after)
	}
}

// ctMapKey returns the conntrack map of a flow's family and the flow's key in it.
func (e *env) ctMapKey(tb testing.TB, f Flow) (*ebpf.Map, any) {
	tb.Helper()
	var ks ctKeys
	if err := ks.add(f); err != nil {
		tb.Fatal(err)
	}
	if len(ks.v4) > 0 {
		return e.d.objs.LbCt4, &ks.v4[0]
	}
	return e.d.objs.LbCt6, &ks.v6[0]
}

// rawCT reads a flow's conntrack value as the datapath stores it.
func (e *env) rawCT(tb testing.TB, f Flow) lbxdpLbCt {
	tb.Helper()
	m, k := e.ctMapKey(tb, f)
	var v lbxdpLbCt
	if err := m.Lookup(k, &v); err != nil {
		tb.Fatal(err)
	}
	return v
}

// setRawCT overwrites a flow's existing conntrack value.
func (e *env) setRawCT(tb testing.TB, f Flow, v lbxdpLbCt) {
	tb.Helper()
	m, k := e.ctMapKey(tb, f)
	if err := m.Update(k, &v, ebpf.UpdateExist); err != nil {
		tb.Fatal(err)
	}
}
