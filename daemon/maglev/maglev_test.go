package maglev

import (
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	gomaglev "github.com/dgryski/go-maglev"
)

// equalBackends returns n weight-1 backends with IDs 1..n and IPv4 keys.
func equalBackends(n int) []Backend {
	bs := make([]Backend, n)
	for i := range bs {
		addr := netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})
		bs[i] = Backend{ID: uint32(i + 1), Key: Key(netip.AddrPortFrom(addr, 80)), Weight: 1}
	}
	return bs
}

func mustBuild(t testing.TB, bs []Backend, m uint32) []uint32 {
	t.Helper()
	table, err := Build(bs, m)
	if err != nil {
		t.Fatalf("build table: %v", err)
	}
	if len(table) != int(m) {
		t.Fatalf("table has %d slots, want %d", len(table), m)
	}
	return table
}

func TestKey(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"10.0.0.1:80", "10.0.0.1:80"},
		{"[2001:db8::1]:80", "[2001:db8::1]:80"},
		{"[2001:DB8:0:0::0001]:443", "[2001:db8::1]:443"},
		{"[fe80::1%eth0]:80", "[fe80::1]:80"},
		{"[::ffff:10.0.0.1]:80", "[::ffff:10.0.0.1]:80"},
	} {
		if got := Key(netip.MustParseAddrPort(tc.in)); got != tc.want {
			t.Errorf("Key(%s) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestIsPrime(t *testing.T) {
	primes := []uint64{2, 3, 5, 7, 251, 509, 1021, 16381, 65521, 65537, 131071, 655373, 4294967291, 18446744073709551557}
	composites := []uint64{0, 1, 4, 9, 561, 1105, 65535, 65536, 131073, 4294967295, 3215031751, 18446744073709551615}
	for _, n := range primes {
		if !IsPrime(n) {
			t.Errorf("IsPrime(%d) = false, want true", n)
		}
	}
	for _, n := range composites {
		if IsPrime(n) {
			t.Errorf("IsPrime(%d) = true, want false", n)
		}
	}
	// Trial division below 2^32 agrees with math/big on every table size.
	for n := uint64(0); n <= MaxTableSize; n++ {
		if IsPrime(n) != new(big.Int).SetUint64(n).ProbablyPrime(0) {
			t.Fatalf("IsPrime(%d) disagrees with math/big", n)
		}
	}
}

func TestValidateTableSize(t *testing.T) {
	for _, m := range append([]uint32{MinTableSize, 65537}, autoSizes...) {
		if err := ValidateTableSize(m); err != nil {
			t.Errorf("ValidateTableSize(%d) = %v, want nil", m, err)
		}
	}
	for _, m := range []uint32{0, 7, 241, 250, 252, 65536, 65535, MaxTableSize - 2, 131101, 655373} {
		err := ValidateTableSize(m)
		if !errors.Is(err, ErrInvalidTableSize) {
			t.Errorf("ValidateTableSize(%d) = %v, want ErrInvalidTableSize", m, err)
		}
		if _, berr := Build(equalBackends(3), m); !errors.Is(berr, ErrInvalidTableSize) {
			t.Errorf("Build with table size %d = %v, want ErrInvalidTableSize", m, berr)
		}
	}
}

func TestValidateBackends(t *testing.T) {
	good := func() []Backend { return equalBackends(3) }
	for _, tc := range []struct {
		name   string
		mutate func([]Backend) []Backend
		m      uint32
		want   error
	}{
		{"empty key", func(b []Backend) []Backend { b[1].Key = ""; return b }, 65537, ErrInvalidBackend},
		{"key with separator", func(b []Backend) []Backend { b[1].Key = "10.0.0.9:80#2"; return b }, 65537, ErrInvalidBackend},
		{"weight 0", func(b []Backend) []Backend { b[2].Weight = 0; return b }, 65537, ErrInvalidBackend},
		{"weight above max", func(b []Backend) []Backend { b[0].Weight = MaxWeight + 1; return b }, 65537, ErrInvalidBackend},
		{"duplicate ID", func(b []Backend) []Backend { b[2].ID = b[0].ID; return b }, 65537, ErrInvalidBackend},
		{"duplicate key", func(b []Backend) []Backend { b[2].Key = b[1].Key; return b }, 65537, ErrInvalidBackend},
		{"weights exceed table", func(b []Backend) []Backend { b[0].Weight, b[1].Weight = 200, 51; return b }, MinTableSize, ErrTooManyEntries},
		{"backends exceed table", func([]Backend) []Backend { return equalBackends(MinTableSize + 1) }, MinTableSize, ErrTooManyEntries},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bs := tc.mutate(good())
			if err := Validate(bs, tc.m); !errors.Is(err, tc.want) {
				t.Errorf("Validate = %v, want %v", err, tc.want)
			}
			table, err := Build(bs, tc.m)
			if !errors.Is(err, tc.want) || table != nil {
				t.Errorf("Build = (%d slots, %v), want (nil, %v)", len(table), err, tc.want)
			}
		})
	}
	if err := Validate(nil, 65537); err != nil {
		t.Errorf("Validate(empty set) = %v, want nil: a service may have no backend", err)
	}
}

// A set that exactly fills the table is accepted, and go-maglev's first round
// then gives every entry exactly one slot.
func TestEntriesFillTable(t *testing.T) {
	bs := equalBackends(MinTableSize - 10)
	bs[0].Weight = 11
	table := mustBuild(t, bs, MinTableSize)
	shares := Shares(table)
	for _, b := range bs {
		if shares[b.ID] != int(b.Weight) {
			t.Errorf("backend %d (weight %d) holds %d slots, want %d", b.ID, b.Weight, shares[b.ID], b.Weight)
		}
	}
}

func TestEmptySetReturnsPromptly(t *testing.T) {
	type result struct {
		table []uint32
		err   error
	}
	done := make(chan result, 1)
	go func() {
		table, err := Build(nil, 65537)
		done <- result{table, err}
	}()
	select {
	case r := <-done:
		if r.table != nil || !errors.Is(r.err, ErrNoBackends) {
			t.Errorf("Build(empty) = (%d slots, %v), want (nil, ErrNoBackends)", len(r.table), r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Build(empty) did not return within 10s (go-maglev hang not guarded)")
	}
	if _, err := Build(nil, 65536); !errors.Is(err, ErrInvalidTableSize) {
		t.Errorf("Build(empty, 65536) = %v, want ErrInvalidTableSize before ErrNoBackends", err)
	}
}

func TestDeterministicAcrossInputOrder(t *testing.T) {
	bs := equalBackends(60)
	for i := range bs {
		bs[i].Weight = uint32(1 + i%4)
	}
	// IPv6 keys too, so the canonical order mixes both families.
	for i := range 10 {
		addr := netip.MustParseAddr(fmt.Sprintf("2001:db8::%x", i+1))
		bs = append(bs, Backend{ID: uint32(1000 + i), Key: Key(netip.AddrPortFrom(addr, 8080)), Weight: 2})
	}
	const m = 65537
	want := mustBuild(t, bs, m)
	valid := make(map[uint32]bool)
	for _, b := range bs {
		valid[b.ID] = true
	}
	for slot, id := range want {
		if !valid[id] {
			t.Fatalf("slot %d holds unknown backend ID %d", slot, id)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20 {
		shuffled := slices.Clone(bs)
		rng.Shuffle(len(shuffled), func(a, b int) { shuffled[a], shuffled[b] = shuffled[b], shuffled[a] })
		if got := mustBuild(t, shuffled, m); !slices.Equal(got, want) {
			t.Fatalf("shuffle %d: table differs from the one built from the original order", i)
		}
	}
}

// The table must be the one go-maglev itself produces for the sorted names;
// this pins the cross-node contract (names, separator, order) and checks the
// package doc's claim that leaving a backend out equals Rebuild with it dead.
func TestMatchesGoMaglev(t *testing.T) {
	const m = 16381
	bs := []Backend{
		{ID: 7, Key: "10.0.0.2:80", Weight: 1},
		{ID: 3, Key: "10.0.0.1:80", Weight: 3},
		{ID: 9, Key: "[2001:db8::1]:80", Weight: 2},
	}
	names := []string{"10.0.0.1:80", "10.0.0.1:80#2", "10.0.0.1:80#3", "10.0.0.2:80", "[2001:db8::1]:80", "[2001:db8::1]:80#2"}
	ids := []uint32{3, 3, 3, 7, 9, 9}

	ref := gomaglev.New(names, m)
	got := mustBuild(t, bs, m)
	for i := range got {
		if want := ids[ref.Lookup(uint64(i))]; got[i] != want {
			t.Fatalf("slot %d = %d, go-maglev on sorted names gives %d", i, got[i], want)
		}
	}

	ref.Rebuild([]int{3}) // "10.0.0.2:80", backend 7
	got = mustBuild(t, []Backend{bs[1], bs[2]}, m)
	for i := range got {
		if want := ids[ref.Lookup(uint64(i))]; got[i] != want {
			t.Fatalf("without backend 7: slot %d = %d, go-maglev Rebuild gives %d", i, got[i], want)
		}
	}
}

func TestEqualWeightsBalance(t *testing.T) {
	const m, n = 65537, 100
	shares := Shares(mustBuild(t, equalBackends(n), m))
	if len(shares) != n {
		t.Fatalf("%d backends hold slots, want %d", len(shares), n)
	}
	ideal := float64(m) / n
	for id, c := range shares {
		if dev := (float64(c) - ideal) / ideal; dev < -0.01 || dev > 0.01 {
			t.Errorf("backend %d holds %d slots, %.2f%% from M/N=%.1f (limit ±1%%)", id, c, 100*dev, ideal)
		}
	}
}

// go-maglev hands out slots in rounds, one per entry per round, so each entry
// ends with ⌊M/E⌋ or ⌈M/E⌉ slots. A backend of weight w therefore holds w·M/E
// slots give or take w: that exact bound is what the test asserts (here under
// 0.2% of the backend's share), rather than a loose statistical tolerance.
func TestWeightsProportional(t *testing.T) {
	const m = 65537
	bs := equalBackends(40)
	var entries uint32
	for i := range bs {
		bs[i].Weight = []uint32{1, 2, 3, 5}[i%4]
		entries += bs[i].Weight
	}
	shares := Shares(mustBuild(t, bs, m))
	for _, b := range bs {
		ideal := float64(b.Weight) * m / float64(entries)
		if d := float64(shares[b.ID]) - ideal; d < -float64(b.Weight) || d > float64(b.Weight) {
			t.Errorf("backend %d (weight %d) holds %d slots, want %.1f ± %d", b.ID, b.Weight, shares[b.ID], ideal, b.Weight)
		}
	}
	// Also state it as a ratio an operator would check: weight 2 ≈ 2× weight 1.
	w1, w2 := shares[bs[0].ID], shares[bs[1].ID]
	if r := float64(w2) / float64(w1); r < 1.99 || r > 2.01 {
		t.Errorf("weight-2 backend holds %.4f× the slots of a weight-1 backend, want 2 ± 0.01", r)
	}
}

// moved counts slots that changed between before and after, ignoring slots
// for which skip returns true.
func moved(before, after []uint32, skip func(before, after uint32) bool) int {
	n := 0
	for i := range before {
		if before[i] != after[i] && !skip(before[i], after[i]) {
			n++
		}
	}
	return n
}

func TestRemoveOneBackendDisruption(t *testing.T) {
	const m, n = 65537, 100
	bs := equalBackends(n)
	before := mustBuild(t, bs, m)
	worst := 0.0
	for r := range bs {
		gone := bs[r].ID
		after := mustBuild(t, slices.Delete(slices.Clone(bs), r, r+1), m)
		if slices.Contains(after, gone) {
			t.Fatalf("removed backend %d still holds slots", gone)
		}
		others := 0
		for _, id := range before {
			if id != gone {
				others++
			}
		}
		// Slots of the removed backend must move; any other move is disruption.
		frac := float64(moved(before, after, func(b, _ uint32) bool { return b == gone })) / float64(others)
		worst = max(worst, frac)
		if frac > 0.01 {
			t.Errorf("removing backend %d moved %.3f%% of the other slots (limit 1%%)", gone, 100*frac)
		}
	}
	t.Logf("worst disruption over %d removals: %.3f%% of the other slots", n, 100*worst)
}

func TestAddOneBackendDisruption(t *testing.T) {
	const m, n = 65537, 100
	bs := equalBackends(n + 1)
	before := mustBuild(t, bs[:n], m)
	after := mustBuild(t, bs, m)
	added := bs[n].ID
	if got, ideal := Shares(after)[added], m/(n+1); got < ideal-1 || got > ideal+1 {
		t.Errorf("new backend holds %d slots, want %d ± 1", got, ideal)
	}
	// Slots taken by the new backend must move; moves between old backends
	// are disruption.
	frac := float64(moved(before, after, func(_, a uint32) bool { return a == added })) / m
	if frac > 0.01 {
		t.Errorf("adding a backend moved %.3f%% of the slots between existing backends (limit 1%%)", 100*frac)
	}
	t.Logf("adding one backend to %d moved %.3f%% of slots between existing backends", n, 100*frac)
}

func TestShares(t *testing.T) {
	got := Shares([]uint32{4, 1, 4, 4, 2})
	want := map[uint32]int{1: 1, 2: 1, 4: 3}
	if len(got) != len(want) {
		t.Fatalf("Shares = %v, want %v", got, want)
	}
	for id, c := range want {
		if got[id] != c {
			t.Errorf("Shares[%d] = %d, want %d", id, got[id], c)
		}
	}
}

// TestTableSize: a size that is set is kept; a derived one is the smallest step with
// SlotsPerBackend slots per backend and a slot per weight unit, whatever the order of
// calls (it depends on the counts alone).
func TestTableSize(t *testing.T) {
	for _, c := range []struct {
		size     uint32
		backends int
		entries  uint64
		want     uint32
	}{
		{251, 1000, 1000, 251}, // set: kept, even when too small (Validate says so)
		{65537, 10, 10, 65537},
		{0, 0, 0, 1021},
		{0, 1, 1, 1021},
		{0, 5, 5, 1021},
		{0, 6, 6, 2039},
		{0, 10, 10, 2039},
		{0, 10, 30, 2039}, // weights up to 3: the backends decide
		{0, 11, 11, 4093},
		{0, 10, 2500, 4093}, // heavy weights: a slot per weight unit at least
		{0, 327, 327, 65537},
		{0, 328, 328, 131071},
		{0, 1024, 1024, 131071},   // the largest size, under 200 slots per backend
		{0, 1024, 200000, 131071}, // too many entries: Validate refuses the service
	} {
		if got := TableSize(c.size, c.backends, c.entries); got != c.want {
			t.Errorf("TableSize(%d, %d, %d) = %d, want %d", c.size, c.backends, c.entries, got, c.want)
		}
	}
}

// TestDerivedSizeQuality checks what the package doc says of derived sizes, with
// random addresses: every backend holds its share within 1/SlotsPerBackend, and one
// backend leaving moves a few percent of the others' slots at most.
func TestDerivedSizeQuality(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{5, 10, 20, 40} {
		bs := make([]Backend, n)
		for i := range bs {
			a := netip.AddrFrom4([4]byte{10, byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256))})
			bs[i] = Backend{ID: uint32(i + 1), Key: Key(netip.AddrPortFrom(a, 8080)), Weight: 1}
		}
		m := TableSize(0, n, uint64(n))
		before := mustBuild(t, bs, m)
		for id, c := range Shares(before) {
			if dev := float64(c)*float64(n)/float64(m) - 1; dev > 1.0/SlotsPerBackend || dev < -1.0/SlotsPerBackend {
				t.Errorf("%d backends in %d slots: backend %d holds %d slots, %.2f%% off its share", n, m, id, c, 100*dev)
			}
		}
		var sum, worst float64
		for r := range bs {
			gone := bs[r].ID
			after := mustBuild(t, slices.Delete(slices.Clone(bs), r, r+1), m)
			frac := float64(moved(before, after, func(b, _ uint32) bool { return b == gone })) / float64(int(m)-Shares(before)[gone])
			sum, worst = sum+frac, max(worst, frac)
		}
		t.Logf("%d backends in %d slots: one leaving moves %.2f%% of the others' slots on average, %.2f%% at worst", n, m, 100*sum/float64(n), 100*worst)
		if sum/float64(n) > 0.03 || worst > 0.05 {
			t.Errorf("%d backends in %d slots: one leaving moves %.2f%% of the others' slots on average, %.2f%% at worst (limits 3%% and 5%%)",
				n, m, 100*sum/float64(n), 100*worst)
		}
	}
}

// TestDigest: equal for the same backends in any order, different when a key, an ID,
// a weight or the size differs.
func TestDigest(t *testing.T) {
	bs := equalBackends(5)
	d := Digest(bs, 1021)
	rev := slices.Clone(bs)
	slices.Reverse(rev)
	if Digest(rev, 1021) != d {
		t.Error("the digest depends on the order of the backends")
	}
	for name, change := range map[string]func([]Backend) ([]Backend, uint32){
		"size":   func(b []Backend) ([]Backend, uint32) { return b, 2039 },
		"weight": func(b []Backend) ([]Backend, uint32) { b[2].Weight = 2; return b, 1021 },
		"id":     func(b []Backend) ([]Backend, uint32) { b[2].ID = 99; return b, 1021 },
		"key":    func(b []Backend) ([]Backend, uint32) { b[2].Key = "10.9.9.9:80"; return b, 1021 },
		"fewer":  func(b []Backend) ([]Backend, uint32) { return b[:4], 1021 },
	} {
		if Digest(change(slices.Clone(bs))) == d {
			t.Errorf("changing the %s left the digest as it was", name)
		}
	}
}
