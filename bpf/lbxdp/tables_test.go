//go:build linux

package lbxdp

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/lbd-dev/lbd/internal/pktgen"
)

func fillTable(m int, ids ...uint32) []uint32 {
	out := make([]uint32, m)
	for i := range out {
		out[i] = ids[i%len(ids)]
	}
	return out
}

// TestChangeTableInPlace changes a table through its inactive half several times:
// every change takes effect for new flows, the table reads back as written, the map is
// never replaced (its ID stays), a change writes only the elements that differ, and a
// change the map cannot hold (another size, more backends than its indexes) is refused
// with ErrTableShape, leaving the table as it was.
func TestChangeTableInPlace(t *testing.T) {
	e := newEnv(t)
	for i := uint32(1); i <= 20; i++ {
		e.addBackend(t, i, fmt.Sprintf("198.18.20.%d", i), 8080, fmt.Sprintf("198.18.10.%d", i))
	}
	e.addService(t, svcSetup{ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1}, nil})
	mapID := func() uint32 {
		var id uint32
		if err := e.d.objs.LbTables.Lookup(uint32(1), &id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	// 100 slots: four elements per half; room for 16 backend indexes.
	first := TableOf(fillTable(100, 1))
	first.Digest, first.Indexes = 7, 3
	p, err := e.d.NewTable(1, first)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.d.InstallTables([]*PendingTable{p}); err != nil {
		t.Fatal(err)
	}
	firstMap := mapID()
	// Table maps carry no BTF: loading it cost a syscall and a kernel object per table.
	if m, err := ebpf.NewMapFromID(ebpf.MapID(firstMap)); err != nil {
		t.Fatal(err)
	} else {
		info, err := m.Info()
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		if id, ok := info.BTFID(); ok {
			t.Fatalf("the table map was created with BTF %d", id)
		}
	}
	port := uint16(41000) // every flow new: conntrack would keep a known one
	expectAll := func(want string) {
		t.Helper()
		for range 30 {
			port++
			if got := e.sendTo(t, pktgen.Packet{Src: client4, Dst: vip4, SrcPort: port, DstPort: 80}); got != netip.MustParseAddr(want) {
				t.Fatalf("new flow went to %v, want %s", got, want)
			}
		}
	}
	expectAll("198.18.20.1")
	one := fillTable(100, 2)
	one[70] = 4
	two := slices.Clone(one)
	two[71] = 4
	// The writes each change needs, with the inactive half holding the table before
	// last: an index for a backend the active half does not use reuses an index that
	// only the inactive half uses, so a whole-table change back and forth rewrites no
	// slot at all.
	for step, c := range []struct {
		slots  []uint32
		writes int
	}{
		{fillTable(100, 2), 6}, // a new index, four slot elements (all 1s before), the head
		{fillTable(100, 3), 2}, // index 0 (backend 1, in the inactive half only) becomes 3
		{fillTable(100, 1), 2},
		{fillTable(100, 2), 2},
		{one, 6}, // a new index; the inactive half held 1s: four elements
		{two, 2}, // one element differs from the table before last
	} {
		before := e.d.Writes()
		next := TableOf(c.slots)
		next.Digest = uint64(step)
		n, err := e.d.ChangeTable(1, next)
		if err != nil {
			t.Fatal(err)
		}
		if got := e.d.Writes() - before; n != c.writes || got != uint64(n) {
			t.Errorf("step %d: wrote %d elements (counted %d), want %d", step, n, got, c.writes)
		}
		if step < 4 {
			expectAll(fmt.Sprintf("198.18.20.%d", c.slots[0]))
		}
		st, err := e.d.ReadTable(1)
		if err != nil || !slices.Equal(st.IDs(), c.slots) || !st.Intact || st.Digest != uint64(step) {
			t.Fatalf("step %d: read back %+v %v", step, st, err)
		}
		if mapID() != firstMap {
			t.Fatalf("step %d: the table map was replaced", step)
		}
	}
	mixed := fillTable(100, 1, 2)
	if _, err := e.d.ChangeTable(1, TableOf(mixed)); err != nil {
		t.Fatal(err)
	}
	seen := map[netip.Addr]bool{}
	for range 100 {
		port++
		seen[e.sendTo(t, pktgen.Packet{Src: client4, Dst: vip4, SrcPort: port, DstPort: 80})] = true
	}
	if len(seen) != 2 {
		t.Fatalf("a table of two backends sent 100 flows to %v", seen)
	}
	// Seventeen backends do not fit 16 indexes; another size does not fit either.
	many := make([]uint32, 100)
	for i := range many {
		many[i] = uint32(1 + i%17)
	}
	for _, bad := range [][]uint32{many, fillTable(101, 3)} {
		if _, err := e.d.ChangeTable(1, TableOf(bad)); !errors.Is(err, ErrTableShape) {
			t.Fatalf("change to %d slots of %d backends: %v, want ErrTableShape", len(bad), len(slices.Compact(slices.Sorted(slices.Values(bad)))), err)
		}
	}
	if got, _ := e.d.MaglevTable(1); !slices.Equal(got, mixed) {
		t.Fatal("a refused change altered the table")
	}
	if err := e.d.SetMaglevTable(1, fillTable(7, 3)); err != nil {
		t.Fatal(err)
	}
	if mapID() == firstMap {
		t.Fatal("a new table did not get a new map")
	}
	expectAll("198.18.20.3")
}
