//go:build linux

package lbxdp

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/lbd-dev/lbd/internal/pktgen"
	"github.com/lbd-dev/lbd/internal/testnet"
)

// filterBits reads lb_vip_filter and returns the buckets whose bit is set.
func filterBits(t *testing.T, d *Datapath) map[uint32]bool {
	t.Helper()
	var f lbxdpLbVipBitmap
	if err := d.objs.LbVipFilter.Lookup(uint32(0), &f); err != nil {
		t.Fatal(err)
	}
	set := map[uint32]bool{}
	for i, b := range f.Bits {
		for j := range 8 {
			if b&(1<<j) != 0 {
				set[uint32(i*8+j)] = true
			}
		}
	}
	return set
}

func bucketOf(a netip.Addr) uint32 {
	b, fam, _ := addrBytes(a)
	return vipBucket(b, fam)
}

// TestVIPFilter: the filter holds exactly the buckets of the VIP addresses,
// the program computes the same buckets as the Go package (a VIP whose bit
// is the only one set is balanced, and passes without it), and an address
// that shares a VIP's bucket is confirmed by lb_vips before anything is
// dropped for it.
func TestVIPFilter(t *testing.T) {
	e := encapEnv(t)
	if n := 8 * len(lbxdpLbVipBitmap{}.Bits); n != 1<<vipFilterOrder {
		t.Fatalf("filter of %d buckets, want %d", n, 1<<vipFilterOrder)
	}
	want := map[uint32]bool{bucketOf(vip4): true, bucketOf(vip4b): true, bucketOf(vip4c): true, bucketOf(vip6): true}
	if got := filterBits(t, e.d); len(got) != len(want) {
		t.Errorf("filter buckets %v, want %v", got, want)
	} else {
		for b := range want {
			if !got[b] {
				t.Errorf("bucket %d of a VIP not set", b)
			}
		}
	}

	for _, p := range []pktgen.Packet{
		{Src: client4, Dst: vip4, SrcPort: 3000, DstPort: 80},
		{Src: client6, Dst: vip6, SrcPort: 3000, DstPort: 80},
	} {
		var only lbxdpLbVipBitmap
		b := bucketOf(p.Dst)
		if err := e.d.objs.LbVipFilter.Update(uint32(0), &only, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
		if v, _ := e.run(t, p.Frame()); v != XDPPass {
			t.Errorf("%v with an empty filter: verdict %v, want XDP_PASS", p.Dst, v)
		}
		only.Bits[b>>3] = 1 << (b & 7)
		if err := e.d.objs.LbVipFilter.Update(uint32(0), &only, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
		if v, _ := e.run(t, p.Frame()); v != XDPTx {
			t.Errorf("%v with only its bucket set (%d): verdict %v, want XDP_TX", p.Dst, b, v)
		}
	}
	if err := e.d.rebuildIndexes(); err != nil {
		t.Fatal(err)
	}

	// A node address in vip4's bucket.
	var twin netip.Addr
	for a := netip.MustParseAddr("198.18.0.0"); a.Is4() && a.As4()[1] < 20; a = a.Next() {
		if bucketOf(a) == bucketOf(vip4) {
			twin = a
			break
		}
	}
	if !twin.IsValid() {
		t.Fatal("no address of 198.18.0.0/15 shares vip4's bucket")
	}
	syn := pktgen.Packet{Src: client4, Dst: twin, SrcPort: 1, DstPort: 80}
	frag := syn
	frag.Payload, frag.Fragment = pktgen.Bytes(40), &pktgen.Fragment{More: true} // a first fragment
	before := e.drops(t)
	for name, f := range map[string][]byte{
		"syn":           syn.Frame(),
		"malformed tcp": pktgen.Edit(syn.Frame(), func(b []byte, at pktgen.Offsets) { b[at.L4+12] = 0x40 }), // data offset 4
		"fragment":      frag.Frame(),
		"short icmp": pktgen.Packet{Src: client4, Dst: twin, Proto: pktgen.ProtoICMPv4, ICMPType: 3, ICMPCode: 3,
			Payload: []byte{0x45, 0}}.Frame(),
	} {
		if v, out := e.run(t, f); v != XDPPass || !bytes.Equal(out, f) {
			t.Errorf("%s to %v (a VIP's bucket): verdict %v, modified %v; want XDP_PASS, untouched", name, twin, v, !bytes.Equal(out, f))
		}
	}
	if after := e.drops(t); !equalDrops(before, after) {
		t.Errorf("drop counters moved for traffic to a non-VIP: %v -> %v", before, after)
	}

	// The last service of an address takes the address's bit with it.
	if err := e.d.DeleteService(ServiceKey{vip4b, 0, ProtoTCP}); err != nil {
		t.Fatal(err)
	}
	if filterBits(t, e.d)[bucketOf(vip4b)] && bucketOf(vip4b) != bucketOf(vip4) && bucketOf(vip4b) != bucketOf(vip6) {
		t.Error("bucket of a removed VIP still set")
	}
}

func equalDrops(a, b map[DropReason]Counters) bool {
	for r, c := range a {
		if b[r] != c {
			return false
		}
	}
	return len(a) == len(b)
}

// TestServiceShortcut: packets of established flows that skip the service
// lookups (lb_svc_by_id) behave as if they had looked the service up.
func TestServiceShortcut(t *testing.T) {
	t.Run("service deleted", func(t *testing.T) {
		e := ctEnv(t)
		syn := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 4000, DstPort: 80}
		e.sendTo(t, syn)
		if err := e.d.DeleteService(ServiceKey{vip4, 80, ProtoTCP}); err != nil {
			t.Fatal(err)
		}
		if v, _ := e.run(t, ackOf(syn).Frame()); v != XDPDrop {
			t.Errorf("established flow of a deleted service: verdict %v, want XDP_DROP (no service)", v)
		}
	})
	t.Run("service replaced under a new ID", func(t *testing.T) {
		e := ctEnv(t)
		keepsBackend(t, e, pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 4001, DstPort: 80}, ServiceKey{vip4, 80, ProtoTCP}, 7)
	})
	t.Run("service moved to another port", func(t *testing.T) {
		e := ctEnv(t)
		syn := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 4002, DstPort: 80}
		e.sendTo(t, syn)
		// As the daemon does: the new key first, then the old one goes.
		if err := e.d.UpsertService(ServiceKey{vip4, 8080, ProtoTCP}, Service{ID: 1}); err != nil {
			t.Fatal(err)
		}
		if got := e.sendTo(t, ackOf(syn)); got != beA {
			t.Errorf("while both keys exist: went to %v", got)
		}
		if err := e.d.DeleteService(ServiceKey{vip4, 80, ProtoTCP}); err != nil {
			t.Fatal(err)
		}
		if v, _ := e.run(t, ackOf(syn).Frame()); v != XDPDrop {
			t.Errorf("flow to the old port: verdict %v, want XDP_DROP (no service)", v)
		}
		moved := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 4002, DstPort: 8080}
		e.sendTo(t, moved)
		if got := e.sendTo(t, ackOf(moved)); got != beA {
			t.Errorf("flow to the new port went to %v", got)
		}
	})
	t.Run("exact service added over a wildcard", func(t *testing.T) {
		e := ctEnv(t)
		if err := e.d.UpsertService(ServiceKey{vip4b, 0, ProtoTCP}, Service{ID: 5}); err != nil {
			t.Fatal(err)
		}
		e.setTable(t, 5, []uint32{1}, 31)
		keepsBackend(t, e, pktgen.Packet{Src: client4, Dst: vip4b, SrcPort: 4003, DstPort: 443}, ServiceKey{vip4b, 443, ProtoTCP}, 6)
	})
	t.Run("source ranges enabled", func(t *testing.T) {
		e := ctEnv(t)
		syn := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 4004, DstPort: 80}
		e.sendTo(t, syn)
		if err := e.d.UpsertService(ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1, SourceRanges: true}); err != nil {
			t.Fatal(err)
		}
		e.expectDrop(t, ackOf(syn).Frame(), DropSourceRange)
		if err := e.d.AddSourceRange(1, netip.PrefixFrom(client4, 32)); err != nil {
			t.Fatal(err)
		}
		if got := e.sendTo(t, ackOf(syn)); got != beA {
			t.Errorf("allowed established flow went to %v", got)
		}
	})
}

// keepsBackend: a flow that syn starts on backend A stays there when key gets a
// service of a new ID whose table holds only B, and that service counts it.
func keepsBackend(t *testing.T, e *env, syn pktgen.Packet, key ServiceKey, id uint32) {
	t.Helper()
	if got := e.sendTo(t, syn); got != beA {
		t.Fatalf("went to %v", got)
	}
	if err := e.d.UpsertService(key, Service{ID: id}); err != nil {
		t.Fatal(err)
	}
	e.setTable(t, id, []uint32{2}, 31)
	if got := e.sendTo(t, ackOf(syn)); got != beA {
		t.Errorf("established flow moved to %v when %v got service ID %d", got, key, id)
	}
	if c, err := e.d.ServiceCounters(id); err != nil || c.Packets != 1 {
		t.Errorf("service ID %d counted %+v (%v), want the packet", id, c, err)
	}
}

// TestConntrackHash: an entry keeps the flow hash, so that later packets get
// the first packet's outer source port without computing it; an entry
// without one (restored from user space) gets the port from the packet.
func TestConntrackHash(t *testing.T) {
	e := ctEnv(t)
	for _, syn := range []pktgen.Packet{
		{Src: client4, Dst: vip4, SrcPort: 5000, DstPort: 80},
		{Src: client6, Dst: vip6, SrcPort: 5000, DstPort: 80},
	} {
		v, out := e.run(t, syn.Frame())
		if v != XDPTx {
			t.Fatalf("verdict %v", v)
		}
		port := pktgen.DecodeGeneve(t, out).UDP.SrcPort
		raw := e.rawCT(t, flowOf(syn))
		if raw.Hash == 0 || uint16(32768+raw.Hash%32768) != uint16(port) {
			t.Errorf("%v: entry hash %#x, outer source port %d", syn.Dst, raw.Hash, port)
		}
		raw.Hash = 0
		e.setRawCT(t, flowOf(syn), raw)
		v, out = e.run(t, ackOf(syn).Frame())
		if v != XDPTx {
			t.Fatalf("verdict %v", v)
		}
		if got := pktgen.DecodeGeneve(t, out).UDP.SrcPort; got != port {
			t.Errorf("%v: entry without hash: outer source port %d, want %d", syn.Dst, got, port)
		}
	}
}

// TestIndexesRebuilt: maps adopted without the filter and service index (as
// pinned by a version that had neither) get them at Load.
func TestIndexesRebuilt(t *testing.T) {
	dir := testnet.BPFFS(t)
	tp := newTopo(t)
	opts := Options{PinPath: dir, ConntrackSize: 4096, MaxServices: 64, MaxBackends: 64}
	d1, err := Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{topo: tp, d: d1}
	e.addBackend(t, 1, "198.18.20.1", 8080, "198.18.10.1")
	e.addService(t, svcSetup{ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1}, []uint32{1}})
	if err := d1.objs.LbVipFilter.Update(uint32(0), &lbxdpLbVipBitmap{}, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if err := d1.objs.LbSvcById.Update(uint32(1), &lbxdpLbSvcEntry{}, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if err := d1.Close(); err != nil {
		t.Fatal(err)
	}
	d2, err := Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if !filterBits(t, d2)[bucketOf(vip4)] {
		t.Error("filter not rebuilt")
	}
	var se lbxdpLbSvcEntry
	if err := d2.objs.LbSvcById.Lookup(uint32(1), &se); err != nil || se.Svc.Id != 1 || se.Key.Port != htons(80) {
		t.Errorf("service index entry %+v (%v)", se, err)
	}
	e.d = d2
	if got := e.sendTo(t, pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 6000, DstPort: 80}); got != beA {
		t.Errorf("went to %v", got)
	}
}
