//go:build linux

package datapath

import (
	"encoding/binary"
	"errors"
	"github.com/lbd-dev/lbd/daemon/model/modeltest"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/lbd-dev/lbd/bpf/lbxdp"
)

// TestUpgradeCarriesLegacyConntrack: a node upgraded from an lbd whose conntrack was one
// LRU map (lb_conntrack, 40-byte values) starts with that map's live flows in the new
// maps, by family, and the former pin removed; its expired flows stay behind.
func TestUpgradeCarriesLegacyConntrack(t *testing.T) {
	n := newNode(t)
	m := n.open(t, n.config(1<<16))
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(n.bpffs, "lb")
	// What the former lbd left: its map, and no current conntrack maps.
	for _, name := range []string{lbxdp.MapConntrack4, lbxdp.MapConntrack6} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	old, err := ebpf.NewMapWithOptions(&ebpf.MapSpec{Name: lbxdp.LegacyConntrackName, Type: ebpf.LRUHash,
		KeySize: 40, ValueSize: 40, MaxEntries: 1 << 16, Pinning: ebpf.PinByName}, ebpf.MapOptions{PinPath: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	now := lbxdp.MonotonicNow()
	type flow struct {
		src     netip.Addr
		backend uint32
		expired bool
	}
	flows := []flow{
		{netip.MustParseAddr("198.51.100.7"), 3, false},
		{netip.MustParseAddr("2001:db8:1::7"), 4, false},
		{netip.MustParseAddr("198.51.100.8"), 5, true},
	}
	for i, f := range flows {
		// struct lb_ct_key and the former struct lb_ct, as that lbd wrote them.
		k, v := make([]byte, 40), make([]byte, 40)
		dst := netip.MustParseAddr("203.0.113.10")
		fam := byte(4)
		if f.src.Is6() {
			dst, fam = netip.MustParseAddr("2001:db8::10"), 6
		}
		copy(k[0:16], f.src.AsSlice())
		copy(k[16:32], dst.AsSlice())
		binary.BigEndian.PutUint16(k[32:], uint16(40000+i))
		binary.BigEndian.PutUint16(k[34:], 80)
		k[36], k[37] = 6, fam
		expires := now + time.Hour
		if f.expired {
			expires = now - time.Second
		}
		binary.NativeEndian.PutUint64(v[0:], uint64(now-time.Minute))
		binary.NativeEndian.PutUint64(v[8:], uint64(now-2*time.Second))
		binary.NativeEndian.PutUint64(v[16:], uint64(expires))
		binary.NativeEndian.PutUint32(v[24:], f.backend)
		binary.NativeEndian.PutUint32(v[28:], 1)
		v[32] = uint8(lbxdp.CTEstablished)
		if err := old.Put(k, v); err != nil {
			t.Fatal(err)
		}
	}

	m2 := n.open(t, n.config(1<<16))
	got := dump(t, m2)
	if len(got) != 2 {
		t.Fatalf("%d flows after the upgrade, want the 2 live ones: %v", len(got), got)
	}
	for i, f := range flows[:2] {
		e, ok := got[lbxdp.Flow{Src: netip.AddrPortFrom(f.src, uint16(40000+i)), Dst: netip.AddrPortFrom(map[bool]netip.Addr{true: netip.MustParseAddr("203.0.113.10"), false: netip.MustParseAddr("2001:db8::10")}[f.src.Is4()], 80), Proto: 6}]
		if !ok || e.BackendID != f.backend || e.State != lbxdp.CTEstablished || e.LastSeen/time.Second != (now-2*time.Second)/time.Second {
			t.Errorf("flow from %v: %+v (found %v)", f.src, e, ok)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, lbxdp.LegacyConntrackName)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("former conntrack still pinned: %v", err)
	}
}

// TestUpgradeRemovesLegacyTables: a node upgraded from an lbd whose Maglev tables had
// 8-byte slots (outer map lb_maglev) starts with that pin removed, its tables freed with
// it, and its services' tables rebuilt in lb_tables by the first sync.
func TestUpgradeRemovesLegacyTables(t *testing.T) {
	n := newNode(t)
	m := n.open(t, n.config(1<<16))
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(n.bpffs, "lb")
	// What the former lbd left: its outer map with one service's table.
	inner := &ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 2*1021 + 1}
	old, err := ebpf.NewMapWithOptions(&ebpf.MapSpec{Name: lbxdp.LegacyTablesName, Type: ebpf.ArrayOfMaps,
		KeySize: 4, ValueSize: 4, MaxEntries: 16385, Pinning: ebpf.PinByName, InnerMap: inner},
		ebpf.MapOptions{PinPath: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	table, err := ebpf.NewMap(inner)
	if err != nil {
		t.Fatal(err)
	}
	defer table.Close()
	if err := old.Put(uint32(1), table); err != nil {
		t.Fatal(err)
	}

	m2 := n.open(t, n.config(1<<16))
	if _, err := os.Stat(filepath.Join(dir, lbxdp.LegacyTablesName)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("former maglev tables still pinned: %v", err)
	}
	svcs := manyServices(1, 3, 0)
	if _, err := m2.Sync(t.Context(), modeltest.All(svcs...)); err != nil {
		t.Fatal(err)
	}
	if st, err := m2.lb.ReadTable(1); err != nil || st == nil || !st.Intact {
		t.Fatalf("service 1's table after the upgrade: %+v, %v", st, err)
	}
}
