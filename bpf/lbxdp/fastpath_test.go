//go:build linux

package lbxdp

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
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
	want := map[uint32]bool{bucketOf(vip4): true, bucketOf(vip4b): true, bucketOf(vip6): true}
	if got := filterBits(t, e.d); len(got) != len(want) {
		t.Errorf("filter buckets %v, want %v", got, want)
	} else {
		for b := range want {
			if !got[b] {
				t.Errorf("bucket %d of a VIP not set", b)
			}
		}
	}

	for _, p := range []pkt{
		{src: client4, dst: vip4, sport: 3000, dport: 80},
		{src: client6, dst: vip6, sport: 3000, dport: 80},
	} {
		var only lbxdpLbVipBitmap
		b := bucketOf(p.dst)
		if err := e.d.objs.LbVipFilter.Update(uint32(0), &only, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
		if v, _ := e.run(t, p.build(t)); v != XDPPass {
			t.Errorf("%v with an empty filter: verdict %v, want XDP_PASS", p.dst, v)
		}
		only.Bits[b>>3] = 1 << (b & 7)
		if err := e.d.objs.LbVipFilter.Update(uint32(0), &only, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
		if v, _ := e.run(t, p.build(t)); v != XDPTx {
			t.Errorf("%v with only its bucket set (%d): verdict %v, want XDP_TX", p.dst, b, v)
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
	badTCP := pkt{src: client4, dst: twin, sport: 1, dport: 80}.build(t)
	badTCP[14+20+12] = 0x40 // data offset 4
	frag := pkt{src: client4, dst: twin, sport: 1, dport: 80, payload: 40}.build(t)
	binary.BigEndian.PutUint16(frag[14+6:], 0x2000) // MF: a first fragment
	frag[14+10], frag[14+11] = 0, 0
	ipc := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: client4.AsSlice(), DstIP: twin.AsSlice()}
	icmp := serialize(t, &layers.Ethernet{SrcMAC: clientMAC, DstMAC: nhMAC, EthernetType: layers.EthernetTypeIPv4}, ipc,
		&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeDestinationUnreachable, 3)},
		gopacket.Payload([]byte{0x45, 0}))
	before := e.drops(t)
	for name, f := range map[string][]byte{
		"syn":           pkt{src: client4, dst: twin, sport: 1, dport: 80}.build(t),
		"malformed tcp": badTCP,
		"fragment":      frag,
		"short icmp":    icmp,
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
		syn := pkt{src: client4, dst: vip4, sport: 4000, dport: 80}
		ack := syn
		ack.tcpFlags = tcpACK
		e.sendTo(t, syn)
		if err := e.d.DeleteService(ServiceKey{vip4, 80, ProtoTCP}); err != nil {
			t.Fatal(err)
		}
		if v, _ := e.run(t, ack.build(t)); v != XDPPass {
			t.Errorf("established flow of a deleted service: verdict %v, want XDP_PASS", v)
		}
	})
	t.Run("service replaced under a new ID", func(t *testing.T) {
		e := ctEnv(t)
		syn := pkt{src: client4, dst: vip4, sport: 4001, dport: 80}
		ack := syn
		ack.tcpFlags = tcpACK
		if got := e.sendTo(t, syn); got != beA {
			t.Fatalf("went to %v", got)
		}
		if err := e.d.UpsertService(ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 7}); err != nil {
			t.Fatal(err)
		}
		e.setTable(t, 7, []uint32{2}, 31)
		if got := e.sendTo(t, ack); got != beA {
			t.Errorf("established flow moved to %v when its service got a new ID", got)
		}
		if c, err := e.d.ServiceCounters(7); err != nil || c.Packets != 1 {
			t.Errorf("new service ID counted %+v (%v), want 1 packet", c, err)
		}
	})
	t.Run("service moved to another port", func(t *testing.T) {
		e := ctEnv(t)
		syn := pkt{src: client4, dst: vip4, sport: 4002, dport: 80}
		ack := syn
		ack.tcpFlags = tcpACK
		e.sendTo(t, syn)
		// As the daemon does: the new key first, then the old one goes.
		if err := e.d.UpsertService(ServiceKey{vip4, 8080, ProtoTCP}, Service{ID: 1}); err != nil {
			t.Fatal(err)
		}
		if got := e.sendTo(t, ack); got != beA {
			t.Errorf("while both keys exist: went to %v", got)
		}
		if err := e.d.DeleteService(ServiceKey{vip4, 80, ProtoTCP}); err != nil {
			t.Fatal(err)
		}
		if v, _ := e.run(t, ack.build(t)); v != XDPPass {
			t.Errorf("flow to the old port: verdict %v, want XDP_PASS", v)
		}
		moved := pkt{src: client4, dst: vip4, sport: 4002, dport: 8080}
		e.sendTo(t, moved)
		moved.tcpFlags = tcpACK
		if got := e.sendTo(t, moved); got != beA {
			t.Errorf("flow to the new port went to %v", got)
		}
	})
	t.Run("exact service added over a wildcard", func(t *testing.T) {
		e := ctEnv(t)
		if err := e.d.UpsertService(ServiceKey{vip4b, 0, ProtoTCP}, Service{ID: 5}); err != nil {
			t.Fatal(err)
		}
		e.setTable(t, 5, []uint32{1}, 31)
		syn := pkt{src: client4, dst: vip4b, sport: 4003, dport: 443}
		ack := syn
		ack.tcpFlags = tcpACK
		if got := e.sendTo(t, syn); got != beA {
			t.Fatalf("went to %v", got)
		}
		if err := e.d.UpsertService(ServiceKey{vip4b, 443, ProtoTCP}, Service{ID: 6}); err != nil {
			t.Fatal(err)
		}
		e.setTable(t, 6, []uint32{2}, 31)
		if got := e.sendTo(t, ack); got != beA {
			t.Errorf("established flow moved to %v", got)
		}
		if c, err := e.d.ServiceCounters(6); err != nil || c.Packets != 1 {
			t.Errorf("exact service counted %+v (%v), want the packet", c, err)
		}
	})
	t.Run("source ranges enabled", func(t *testing.T) {
		e := ctEnv(t)
		syn := pkt{src: client4, dst: vip4, sport: 4004, dport: 80}
		ack := syn
		ack.tcpFlags = tcpACK
		e.sendTo(t, syn)
		if err := e.d.UpsertService(ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1, SourceRanges: true}); err != nil {
			t.Fatal(err)
		}
		e.expectDrop(t, ack.build(t), DropSourceRange)
		if err := e.d.AddSourceRange(1, netip.PrefixFrom(client4, 32)); err != nil {
			t.Fatal(err)
		}
		if got := e.sendTo(t, ack); got != beA {
			t.Errorf("allowed established flow went to %v", got)
		}
	})
}

// TestConntrackHash: an entry keeps the flow hash, so that later packets get
// the first packet's outer source port without computing it; an entry
// without one (restored from user space) gets the port from the packet.
func TestConntrackHash(t *testing.T) {
	e := ctEnv(t)
	for _, syn := range []pkt{
		{src: client4, dst: vip4, sport: 5000, dport: 80},
		{src: client6, dst: vip6, sport: 5000, dport: 80},
	} {
		ack := syn
		ack.tcpFlags = tcpACK
		v, out := e.run(t, syn.build(t))
		if v != XDPTx {
			t.Fatalf("verdict %v", v)
		}
		port := decodeEncap(t, out).udp.SrcPort
		k, err := flowOf(syn).raw()
		if err != nil {
			t.Fatal(err)
		}
		var raw lbxdpLbCt
		if err := e.d.objs.LbConntrack.Lookup(&k, &raw); err != nil {
			t.Fatal(err)
		}
		if raw.Hash == 0 || uint16(32768+raw.Hash%32768) != uint16(port) {
			t.Errorf("%v: entry hash %#x, outer source port %d", syn.dst, raw.Hash, port)
		}
		raw.Hash = 0
		if err := e.d.objs.LbConntrack.Update(&k, &raw, ebpf.UpdateExist); err != nil {
			t.Fatal(err)
		}
		v, out = e.run(t, ack.build(t))
		if v != XDPTx {
			t.Fatalf("verdict %v", v)
		}
		if got := decodeEncap(t, out).udp.SrcPort; got != port {
			t.Errorf("%v: entry without hash: outer source port %d, want %d", syn.dst, got, port)
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
	if got := e.sendTo(t, pkt{src: client4, dst: vip4, sport: 6000, dport: 80}); got != beA {
		t.Errorf("went to %v", got)
	}
}
