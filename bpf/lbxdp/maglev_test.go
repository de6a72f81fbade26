//go:build linux

package lbxdp

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/dgryski/go-maglev"
	"github.com/lbd-dev/lbd/internal/pktgen"
)

// buildTable builds a Maglev table the way the daemon does: sorted backend
// keys, weight w as w replicas "key#i", then every slot read out.
func buildTable(t *testing.T, ids []uint32, weights map[uint32]int, m uint64) []uint32 {
	t.Helper()
	var names []string
	byName := map[string]uint32{}
	for _, id := range ids {
		w := max(weights[id], 1)
		for r := range w {
			n := fmt.Sprintf("198.18.%d.%d:8080", 20+id/250, id%250+1)
			if r > 0 {
				n += fmt.Sprintf("#%d", r+1)
			}
			names = append(names, n)
			byName[n] = id
		}
	}
	slices.Sort(names)
	mt := maglev.New(names, m)
	table := make([]uint32, m)
	for i := range table {
		table[i] = byName[names[mt.Lookup(uint64(i))]]
	}
	return table
}

// TestMaglevQuality checks the tables as the datapath holds them (written and
// read back through the map): balance within ±1%, weights in proportion, and
// minimal disruption when a backend leaves.
func TestMaglevQuality(t *testing.T) {
	e := newEnv(t)
	const m = 65537
	ids := make([]uint32, 100)
	for i := range ids {
		ids[i] = uint32(i + 1)
	}
	readBack := func(table []uint32) []uint32 {
		if err := e.d.SetMaglevTable(5, table); err != nil {
			t.Fatal(err)
		}
		got, err := e.d.MaglevTable(5)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, table) {
			t.Fatal("table read back from the map differs from the one written")
		}
		return got
	}
	within := func(name string, count int, want float64) {
		if d := (float64(count) - want) / want; d > 0.01 || d < -0.01 {
			t.Errorf("%s: %d slots, want %.1f ±1%%", name, count, want)
		}
	}

	before := readBack(buildTable(t, ids, nil, m))
	counts := map[uint32]int{}
	for _, id := range before {
		counts[id]++
	}
	for _, id := range ids {
		within(fmt.Sprintf("backend %d", id), counts[id], float64(m)/100)
	}

	after := readBack(buildTable(t, ids[1:], nil, m))
	moved, others := 0, 0
	for i := range before {
		if before[i] == ids[0] {
			if after[i] == ids[0] {
				t.Fatal("removed backend still in the table")
			}
			continue
		}
		others++
		if before[i] != after[i] {
			moved++
		}
	}
	if float64(moved) > 0.01*float64(others) {
		t.Errorf("removing one backend of 100 moved %d of %d other slots (> 1%%)", moved, others)
	}

	weights := map[uint32]int{}
	for _, id := range ids[:25] {
		weights[id] = 2
	}
	weighted := readBack(buildTable(t, ids[:75], weights, m))
	counts = map[uint32]int{}
	for _, id := range weighted {
		counts[id]++
	}
	for _, id := range ids[:75] {
		within(fmt.Sprintf("weighted backend %d", id), counts[id], float64(m)/100*float64(max(weights[id], 1)))
	}
}

// TestMaglevDatapath: the datapath indexes the table with the flow hash
// (flows spread over all backends), honours the source-address hash mode, and
// sees a table swap of a different size at once.
func TestMaglevDatapath(t *testing.T) {
	e := newEnv(t)
	var ids []uint32
	for i := uint32(1); i <= 4; i++ {
		e.addBackend(t, i, fmt.Sprintf("198.18.20.%d", i), 8080, fmt.Sprintf("198.18.10.%d", i))
		ids = append(ids, i)
	}
	e.addService(t, svcSetup{ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1}, nil})
	e.addService(t, svcSetup{ServiceKey{vip4, 81, ProtoTCP}, Service{ID: 2, HashMode: HashSourceAddr}, nil})
	table := buildTable(t, ids, nil, 251)
	for _, id := range []uint32{1, 2} {
		if err := e.d.SetMaglevTable(id, table); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("five-tuple spreads ports", func(t *testing.T) {
		seen := map[netip.Addr]int{}
		for i := range 400 {
			seen[e.sendTo(t, pktgen.Packet{Src: client4, Dst: vip4, SrcPort: uint16(10000 + i), DstPort: 80})]++
		}
		for _, n := range seen {
			if len(seen) != 4 || n < 50 {
				t.Fatalf("400 flows over 4 backends: %v", seen)
			}
		}
	})
	t.Run("source hash keeps a client on one backend", func(t *testing.T) {
		clients := map[netip.Addr]bool{}
		for c := range 40 {
			src := netip.AddrFrom4([4]byte{198, 18, 201, byte(c + 1)})
			first := e.sendTo(t, pktgen.Packet{Src: src, Dst: vip4, SrcPort: 10000, DstPort: 81})
			for i := 1; i < 10; i++ {
				if got := e.sendTo(t, pktgen.Packet{Src: src, Dst: vip4, SrcPort: uint16(10000 + i*7), DstPort: 81}); got != first {
					t.Fatalf("client %v: port %d went to %v, first flow to %v", src, 10000+i*7, got, first)
				}
			}
			clients[first] = true
		}
		if len(clients) < 3 {
			t.Errorf("40 clients used only %d backends", len(clients))
		}
	})
	t.Run("swap to a smaller table", func(t *testing.T) {
		e.setTable(t, 1, []uint32{3}, 7)
		for i := range 20 {
			if got := e.sendTo(t, pktgen.Packet{Src: client4, Dst: vip4, SrcPort: uint16(30000 + i), DstPort: 80}); got != netip.MustParseAddr("198.18.20.3") {
				t.Fatalf("new flow went to %v after swapping in a one-backend table", got)
			}
		}
		got, err := e.d.MaglevTable(1)
		if err != nil || len(got) != 7 {
			t.Fatalf("table read back: %v %v", got, err)
		}
	})
}
