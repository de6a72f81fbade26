//go:build linux

package lbxdp

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/lbd-dev/lbd/internal/pktgen"
	"github.com/lbd-dev/lbd/internal/testnet"
)

// TestPinnedAdoption: a second Load with the same pin directory adopts the
// maps, state included, as a restarted daemon would.
func TestPinnedAdoption(t *testing.T) {
	dir := testnet.BPFFS(t)
	opts := Options{PinPath: dir, ConntrackSize: 4096, MaxServices: 64, MaxBackends: 64}
	d1, err := Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.HashSeed, cfg.VNI, cfg.Source4 = 77, 1234, src4
	key := ServiceKey{vip4, 80, ProtoTCP}
	steps := []error{
		d1.SetConfig(cfg),
		d1.UpsertService(key, Service{ID: 3, HashMode: HashSourceAddr}),
		d1.UpsertBackend(5, Backend{Addr: netip.MustParseAddr("198.18.20.5"), Port: 80, Node: netip.MustParseAddr("198.18.10.5")}),
		d1.SetMaglevTable(3, []uint32{5, 5, 5, 5, 5, 5, 5}),
	}
	for _, err := range steps {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := d1.Close(); err != nil {
		t.Fatal(err)
	}

	d2, err := Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if got, err := d2.Config(); err != nil || got != cfg {
		t.Errorf("adopted config %+v (%v), want %+v", got, err, cfg)
	}
	svcs, err := d2.Services()
	if err != nil || svcs[key] != (Service{ID: 3, HashMode: HashSourceAddr}) {
		t.Errorf("adopted services %v (%v)", svcs, err)
	}
	if b, ok, err := d2.Backend(5); err != nil || !ok || b.Port != 80 {
		t.Errorf("adopted backend %+v %v %v", b, ok, err)
	}
	if tb, err := d2.MaglevTable(3); err != nil || len(tb) != 7 {
		t.Errorf("adopted table %v (%v)", tb, err)
	}

	// Another conntrack size cannot adopt the pinned map: the daemon must
	// migrate instead of silently losing entries.
	opts.ConntrackSize = 8192
	if d3, err := Load(opts); err == nil {
		d3.Close()
		t.Error("loading with another conntrack size adopted the pinned map")
	}
}

// TestLargeConntrack: the default conntrack is sized for 1M flows, with a
// quarter more entries as headroom, and accepts them.
func TestLargeConntrack(t *testing.T) {
	tp := newTopo(t)
	d := loadDatapath(t, Options{MaxServices: 16, MaxBackends: 16})
	for _, m := range []*ebpf.Map{d.objs.LbCt4, d.objs.LbCt6} {
		if n := m.MaxEntries(); n != 1<<20+1<<18 {
			t.Fatalf("conntrack max entries %d, want 1M + 256K", n)
		}
	}
	e := &env{topo: tp, d: d}
	e.addBackend(t, 1, "198.18.20.1", 80, "198.18.10.1")
	e.addService(t, svcSetup{ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1}, []uint32{1}})
	e.sendTo(t, pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1, DstPort: 80})
	if _, ok, err := d.ConntrackLookup(flowOf(pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1, DstPort: 80})); !ok || err != nil {
		t.Errorf("flow not tracked: %v", err)
	}
}

// TestAttach attaches the program in native mode to a veth.
func TestAttach(t *testing.T) {
	e := newEnv(t)
	e.ns.Do(t, func() {
		l, err := e.d.Attach(e.ifA)
		if err != nil {
			t.Fatal(err)
		}
		info, err := l.Info()
		if err != nil {
			t.Fatal(err)
		}
		if x := info.XDP(); x == nil || int(x.Ifindex) != e.ifA {
			t.Errorf("link info %+v", info)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	})
}
