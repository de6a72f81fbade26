//go:build linux

package datapath

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/gc"
	"github.com/lbd-dev/lbd/internal/nsdo"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

func requireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: loads BPF programs and creates network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		tb.Skip("needs iproute2's ip")
	}
}

func suffix(tb testing.TB) string {
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		tb.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func sh(tb testing.TB, args ...string) {
	tb.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		tb.Fatalf("%v: %v\n%s", args, err, out)
	}
}

// node is a network namespace with an uplink (198.18.0.1/24) whose next hop
// 198.18.0.2 has a permanent neighbour entry, and backend nodes routed through it in
// 198.18.10.0/24, plus a private bpffs directory.
type node struct {
	ns     netns.NsHandle
	uplink string
	bpffs  string
}

func newNode(tb testing.TB) *node {
	tb.Helper()
	requireRoot(tb)
	sfx := suffix(tb)
	name := "dpm-" + sfx
	up, peer := "dpa"+sfx, "dpb"+sfx
	sh(tb, "ip", "netns", "add", name)
	tb.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	ipn := func(args ...string) { sh(tb, append([]string{"ip", "-n", name}, args...)...) }
	ipn("link", "add", up, "type", "veth", "peer", "name", peer)
	for _, l := range []string{up, peer, "lo"} {
		ipn("link", "set", l, "up")
	}
	ipn("addr", "add", "198.18.0.1/24", "dev", up)
	ipn("neigh", "add", "198.18.0.2", "lladdr", "02:00:00:00:00:02", "dev", up, "nud", "permanent")
	ipn("route", "add", "198.18.10.0/24", "via", "198.18.0.2", "dev", up)
	sh(tb, "ip", "netns", "exec", name, "sysctl", "-qw", "net.ipv4.conf.all.forwarding=1")
	ns, err := netns.GetFromName(name)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ns.Close() })
	dir, err := os.MkdirTemp("", "lbd-dp-test-")
	if err != nil {
		tb.Fatal(err)
	}
	bpffs := filepath.Join(dir, "bpf")
	tb.Cleanup(func() {
		// The manager mounted a bpffs on it; pins and maps go with the mount.
		if err := unix.Unmount(bpffs, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			tb.Errorf("unmount %s: %v", bpffs, err)
		}
		if err := os.RemoveAll(dir); err != nil {
			tb.Errorf("remove %s: %v", dir, err)
		}
	})
	return &node{ns: ns, uplink: up, bpffs: bpffs}
}

// in runs fn on a thread inside the node's namespace.
func (n *node) in(tb testing.TB, fn func()) {
	tb.Helper()
	if err := nsdo.Run(n.ns, fn); err != nil {
		tb.Fatal(err)
	}
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
	n.in(tb, func() {
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
