//go:build linux

package datapath

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/gc"
	"github.com/lbd-dev/lbd/internal/testnet"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// node is a network namespace with an uplink (198.18.0.1/24) whose next hop
// 198.18.0.2 has a permanent neighbour entry, and backend nodes routed through it in
// 198.18.10.0/24, plus a directory for the manager's bpffs.
type node struct {
	ns     *testnet.NS
	uplink string
	bpffs  string
}

func newNode(tb testing.TB) *node {
	tb.Helper()
	sfx := testnet.Suffix(tb)
	ns := testnet.NewNS(tb, "dpm-"+sfx)
	up, peer := "dpa"+sfx, "dpb"+sfx
	testnet.Veth(tb, testnet.VethEnd{NS: ns, Name: up}, testnet.VethEnd{NS: ns, Name: peer})
	ns.AddAddr(tb, up, netip.MustParsePrefix("198.18.0.1/24"))
	ns.IP(tb,
		"neigh add 198.18.0.2 lladdr 02:00:00:00:00:02 dev "+up+" nud permanent",
		"route add 198.18.10.0/24 via 198.18.0.2 dev "+up)
	ns.Sysctl(tb, "net.ipv4.conf.all.forwarding=1")
	// The manager mounts a bpffs there itself, as lbd does.
	return &node{ns: ns, uplink: up, bpffs: testnet.MountDir(tb)}
}

func (n *node) config(conntrack uint32) Config {
	return Config{
		LB: true, Interfaces: []string{n.uplink}, BPFFSDir: n.bpffs, HashSeed: 42, VNI: 2,
		ConntrackSize: conntrack, MaxServices: 16385, MaxBackends: 200001,
		GC: gc.Interval{Min: time.Second, Max: time.Minute, Start: 10 * time.Second},
	}
}

// open opens a manager in the node; it is closed (not detached) at cleanup.
func (n *node) open(tb testing.TB, cfg Config) *Manager {
	tb.Helper()
	var m *Manager
	n.ns.Do(tb, func() {
		var err error
		m, err = Open(cfg, hclog.NewNullLogger())
		if err != nil {
			tb.Fatalf("open datapath: %+v", err)
		}
	})
	tb.Cleanup(func() { m.Close() })
	return m
}

// service builds a normalized service as the store would hand it over.
func service(id uint32, name, vip string, port uint32, m uint32, backends ...*lbdv1.Backend) *lbdv1.Service {
	return &lbdv1.Service{
		Id: id, Name: name, Vip: vip, Port: port, Protocol: lbdv1.Protocol_PROTOCOL_TCP,
		MaglevTableSize: m, HashMode: lbdv1.HashMode_HASH_MODE_FIVE_TUPLE, Backends: backends,
	}
}

func backend(id uint32, addr string, port uint32, state lbdv1.BackendState) *lbdv1.Backend {
	return &lbdv1.Backend{Id: id, Address: addr, Port: port, NodeAddress: addr, Weight: 1, State: state}
}

const active = lbdv1.BackendState_BACKEND_STATE_ACTIVE

func netip4(a, b, c, d byte, port uint16) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{a, b, c, d}), port)
}

// manyServices builds n services of per backends each, IDs 1..n and backend IDs from 1,
// as the store would hand them over; size 0 lets each table's size follow its backends.
// Every VIP:port and backend is distinct.
func manyServices(n, per int, size uint32) []*lbdv1.Service {
	svcs := make([]*lbdv1.Service, n)
	for i := range n {
		bes := make([]*lbdv1.Backend, per)
		for j := range per {
			bes[j] = backend(uint32(i*per+j+1), fmt.Sprintf("198.18.%d.%d", 10+j, i%250+1), uint32(8000+i/250), active)
		}
		svcs[i] = service(uint32(i+1), fmt.Sprintf("svc-%d", i), fmt.Sprintf("203.0.113.%d", i%250+1), uint32(1000+i/250), size, bes...)
	}
	return svcs
}
