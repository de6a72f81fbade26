//go:build linux

package lbxdp

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/lbd-dev/lbd/internal/pktgen"
)

// TestUpdateMaglevTableInPlace changes a table through its inactive half several times:
// every change takes effect for new flows, the table reads back as written, the map is
// never replaced (its ID stays), and a change of size falls back to a new map.
func TestUpdateMaglevTableInPlace(t *testing.T) {
	e := newEnv(t)
	for i := uint32(1); i <= 3; i++ {
		e.addBackend(t, i, fmt.Sprintf("198.18.20.%d", i), 8080, fmt.Sprintf("198.18.10.%d", i))
	}
	e.addService(t, svcSetup{ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1}, nil})
	fill := func(m int, ids ...uint32) []uint32 {
		out := make([]uint32, m)
		for i := range out {
			out[i] = ids[i%len(ids)]
		}
		return out
	}
	mapID := func() uint32 {
		var id uint32
		if err := e.d.objs.LbMaglev.Lookup(uint32(1), &id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	table := fill(31, 1)
	if err := e.d.SetMaglevTable(1, table); err != nil {
		t.Fatal(err)
	}
	first := mapID()
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
	for step, next := range [][]uint32{fill(31, 2), fill(31, 3), fill(31, 1), fill(31, 2)} {
		if err := e.d.UpdateMaglevTable(1, table, next); err != nil {
			t.Fatal(err)
		}
		table = next
		expectAll(fmt.Sprintf("198.18.20.%d", next[0]))
		got, err := e.d.MaglevTable(1)
		if err != nil || !slices.Equal(got, next) {
			t.Fatalf("step %d: read back %v %v", step, got, err)
		}
		if mapID() != first {
			t.Fatalf("step %d: the table map was replaced", step)
		}
	}
	mixed := fill(31, 1, 2)
	if err := e.d.UpdateMaglevTable(1, table, mixed); err != nil {
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
	if err := e.d.UpdateMaglevTable(1, mixed, fill(7, 3)); err != nil {
		t.Fatal(err)
	}
	if mapID() == first {
		t.Fatal("a new size did not get a new map")
	}
	expectAll("198.18.20.3")
}
