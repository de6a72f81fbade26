// Package maglev computes the per-service Maglev lookup tables that the LB
// node's XDP program indexes with a flow hash.
//
// The permutations come from github.com/dgryski/go-maglev; this package adds
// what the datapath needs around it: weights, a canonical input order,
// validation, and a table of stable backend IDs instead of list indexes.
//
// Determinism: every LB node must build the same table from the same backend
// set, or a flow moved by the router to another node lands on another backend.
// go-maglev's table depends on the order of its input (docs/testing.md,
// "go-maglev": 11 of 65537 slots differed for the same three names in another
// order), so the entry names are sorted bytewise before they are handed over. That order is
// part of the cross-node contract: changing it changes every table.
//
// Weights: a backend of weight w contributes w entries named "key",
// "key#2", ..., "key#w". go-maglev fills the table in rounds, one slot per
// entry per round, so with E entries in total each entry ends with
// ⌊M/E⌋ or ⌈M/E⌉ slots and a backend of weight w holds w of those shares.
//
// Unusable backends (draining, disabled, unhealthy) are left out of the input
// rather than passed to go-maglev's Rebuild as dead indexes. The table is the
// same either way, since an entry's permutation depends only on its name, and
// it sidesteps two go-maglev hangs: New never returns for an empty list and
// Rebuild never returns when every index is dead. Build never calls go-maglev
// with an empty list; it returns ErrNoBackends instead.
package maglev

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	gomaglev "github.com/dgryski/go-maglev"
)

// Table size bounds. The datapath indexes a table with hash % M; go-maglev's
// permutations only visit every slot when M is prime. A service may set its size;
// one that does not gets a size derived from its backends (TableSize).
//
// M trades memory and build time against disruption, the share of other
// backends' slots that move when one backend leaves (≤ 1% is the usual aim;
// derived sizes give a few percent, see SlotsPerBackend). Measured worst case over
// removals, equal weights, sequential addresses:
//
//	M=16381:  0.62% (10 backends), 1.2% (50), 1.4% (100), 1.8% (163)
//	M=65537:  0.29% (10), 0.65% (100), 0.89% (300), 0.64% (1000)
//	M=131071: 0.23% (10), 0.40% (100), 0.61% (1000)
//
// A build takes about 0.5-1 ms at M=16381, 2.5-4.5 ms at 65537 and 6-11 ms
// at 131071 (10 to 1000 backends, 2 vCPUs); go-maglev's fill loop dominates.
const (
	// MinTableSize keeps one slot under 0.4% of a service's new flows. Tables
	// this small suit services with a few backends that rarely change: they
	// move several percent of other flows when a backend leaves.
	MinTableSize = 251
	// MaxTableSize caps one table at 512 KiB in the datapath (two halves of
	// 2-byte slots) and a build at about 11 ms, so a backend change still
	// reaches the datapath quickly.
	MaxTableSize = 131071
)

// Derived table sizes. A service without a size of its own gets the smallest of
// autoSizes with at least SlotsPerBackend slots per backend (and a slot per weight
// unit), so that its memory and build time follow its backends: 2039 slots (8.5 KiB
// in the datapath) for 10 backends instead of 65537 (256 KiB).
//
// Every LB node must derive the same size from the same service, or their tables
// differ: the size depends only on the service's backends as configured (their
// number and weights, whatever their state or health), never on node-local health
// or reachability, nor on history. Adding a backend that crosses a step (here, the
// 11th: 2200 > 2039 slots) rebuilds the table at the next size, which moves most new
// flows: established flows keep their backend through conntrack, as for any change.
//
// With SlotsPerBackend slots per backend, a backend's share of new flows is within
// 1/SlotsPerBackend (0.5%) of its weight's, and one backend leaving moves a few
// percent of the other backends' slots (TestDerivedSizeQuality, random addresses,
// mean and worst over every removal: 5 backends in 1021 slots 1.9% and 2.7%, 10 in
// 2039 1.7% and 2.2%, 20 in 4093 1.7% and 2.2%, 40 in 8191 1.5% and 1.7%; at 65537
// it is under 1%). A build takes about 80 µs at 2039 slots, 1.2 ms at 16381 and 3 ms
// at 65537: derived sizes let 10,000 services of 10 backends build in about a
// second on 2 CPUs, where 65537 takes 15.
const SlotsPerBackend = 200

var autoSizes = []uint32{1021, 2039, 4093, 8191, 16381, 32749, 65537, MaxTableSize}

// TableSize is the size of a service's table: size when it is set (nonzero), else
// derived from backends, the number of the service's backends whatever their state,
// and entries, the sum of their weights (see SlotsPerBackend).
func TableSize(size uint32, backends int, entries uint64) uint32 {
	if size != 0 {
		return size
	}
	need := max(uint64(backends)*SlotsPerBackend, entries)
	for _, m := range autoSizes {
		if uint64(m) >= need {
			return m
		}
	}
	return MaxTableSize
}

// MaxWeight is the largest backend weight. A backend costs one go-maglev
// entry per unit of weight, so the bound keeps table builds fast; it is also
// ample for the relative capacities an operator expresses with weights.
const MaxWeight = 256

// ReplicaSeparator joins a backend key and its replica number in the entry
// names fed to go-maglev ("10.0.0.1:80#2"). Keys may not contain it, so no
// two backends can produce the same entry name.
const ReplicaSeparator = "#"

var (
	// ErrNoBackends is returned by Build when there is no usable backend: the
	// service gets no table, and the datapath treats it as having no backend.
	ErrNoBackends = errors.New("no usable backends")
	// ErrInvalidTableSize reports a table size that is not a prime within
	// [MinTableSize, MaxTableSize].
	ErrInvalidTableSize = errors.New("invalid maglev table size")
	// ErrInvalidBackend reports a backend with an empty or malformed key, a
	// weight out of range, or an ID or key already used by another backend.
	ErrInvalidBackend = errors.New("invalid maglev backend")
	// ErrTooManyEntries reports a backend set whose weights add up to more
	// than the table size, which would leave some entries without a slot.
	ErrTooManyEntries = errors.New("too many maglev entries for table size")
)

// Backend is one usable backend of a service as the Maglev table sees it.
type Backend struct {
	// ID is the stable backend ID the datapath stores in the table.
	ID uint32
	// Key identifies the backend in go-maglev's hashing; build it with Key
	// so every node derives the same string for the same backend.
	Key string
	// Weight is the number of entries the backend gets, 1..MaxWeight.
	Weight uint32
}

// Key returns the canonical key of a backend address: "10.0.0.1:80" for
// IPv4 and "[2001:db8::1]:80" for IPv6 (RFC 5952 text, zone dropped), so
// differently spelled inputs for the same address yield the same key.
func Key(addr netip.AddrPort) string {
	return netip.AddrPortFrom(addr.Addr().WithZone(""), addr.Port()).String()
}

// IsPrime reports whether n is prime. It is exact for every uint64.
func IsPrime(n uint64) bool {
	if n < 1<<32 {
		// Trial division: at most 181 steps for a table size, and no allocation
		// (ProbablyPrime seeds a random source on every call).
		if n < 2 || (n%2 == 0 && n != 2) {
			return false
		}
		for d := uint64(3); d*d <= n; d += 2 {
			if n%d == 0 {
				return false
			}
		}
		return true
	}
	// ProbablyPrime(0) runs Baillie-PSW only, which has no known
	// counterexample and is documented to be exact below 2^64.
	return new(big.Int).SetUint64(n).ProbablyPrime(0)
}

// ValidateTableSize checks that m is a prime in [MinTableSize, MaxTableSize].
func ValidateTableSize(m uint32) error {
	if m < MinTableSize || m > MaxTableSize {
		return fmt.Errorf("%w: %d outside [%d, %d]", ErrInvalidTableSize, m, MinTableSize, MaxTableSize)
	}
	if !IsPrime(uint64(m)) {
		return fmt.Errorf("%w: %d is not prime", ErrInvalidTableSize, m)
	}
	return nil
}

// Validate checks a backend set and table size without building the table.
// An empty backend set is valid (the service simply has no table).
func Validate(backends []Backend, m uint32) error {
	if err := ValidateTableSize(m); err != nil {
		return err
	}
	ids := make(map[uint32]struct{}, len(backends))
	keys := make(map[string]struct{}, len(backends))
	var entries uint64
	for _, b := range backends {
		switch {
		case b.Key == "":
			return fmt.Errorf("%w: backend %d: empty key", ErrInvalidBackend, b.ID)
		case strings.Contains(b.Key, ReplicaSeparator):
			return fmt.Errorf("%w: backend %d: key %q contains %q", ErrInvalidBackend, b.ID, b.Key, ReplicaSeparator)
		case b.Weight < 1 || b.Weight > MaxWeight:
			return fmt.Errorf("%w: backend %d: weight %d outside [1, %d]", ErrInvalidBackend, b.ID, b.Weight, MaxWeight)
		}
		if _, dup := ids[b.ID]; dup {
			return fmt.Errorf("%w: duplicate backend ID %d", ErrInvalidBackend, b.ID)
		}
		if _, dup := keys[b.Key]; dup {
			return fmt.Errorf("%w: duplicate backend key %q", ErrInvalidBackend, b.Key)
		}
		ids[b.ID] = struct{}{}
		keys[b.Key] = struct{}{}
		entries += uint64(b.Weight)
	}
	if entries > uint64(m) {
		return fmt.Errorf("%w: weights of %d backends add up to %d, table size is %d",
			ErrTooManyEntries, len(backends), entries, m)
	}
	return nil
}

// Build returns the Maglev table of size m for the usable backends: slot i
// holds the ID of the backend for flows whose hash % m == i. The result does
// not depend on the order of backends. Every backend of weight w holds at
// least w slots. With no backends it returns a nil table and ErrNoBackends.
func Build(backends []Backend, m uint32) ([]uint32, error) {
	idx, err := BuildIndexed(backends, m)
	if err != nil {
		return nil, err
	}
	table := make([]uint32, m)
	for i, x := range idx {
		table[i] = backends[x].ID
	}
	return table, nil
}

// MaxIndexed is the most backends BuildIndexed takes: its slots are 16 bits.
const MaxIndexed = 1 << 16

// BuildIndexed is Build with each slot holding the backend's position in backends
// rather than its ID: the datapath stores tables that way, 2 bytes a slot.
func BuildIndexed(backends []Backend, m uint32) ([]uint16, error) {
	if err := Validate(backends, m); err != nil {
		return nil, err
	}
	if len(backends) == 0 {
		return nil, ErrNoBackends
	}
	if len(backends) > MaxIndexed {
		return nil, fmt.Errorf("%w: %d backends, more than %d", ErrInvalidBackend, len(backends), MaxIndexed)
	}

	type entry struct {
		name    string
		backend uint16
	}
	var n int
	for _, b := range backends {
		n += int(b.Weight)
	}
	entries := make([]entry, 0, n)
	for i, b := range backends {
		entries = append(entries, entry{b.Key, uint16(i)})
		for r := uint32(2); r <= b.Weight; r++ {
			entries = append(entries, entry{b.Key + ReplicaSeparator + strconv.FormatUint(uint64(r), 10), uint16(i)})
		}
	}
	// Validate made every name unique, so this order is total.
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.name, b.name) })

	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.name
	}
	t := gomaglev.New(names, uint64(m))
	table := make([]uint16, m)
	for i := range table {
		table[i] = entries[t.Lookup(uint64(i))].backend
	}
	return table, nil
}

// buildVersion changes whenever Build would build another table from the same
// input: it is part of every Digest.
const buildVersion = 1

// Digest identifies the table Build makes of the backends and size: equal digests,
// equal tables (a table is stored with its digest, so that a restarted daemon can
// check it without building it). Like the table, it does not depend on the order of
// backends.
func Digest(backends []Backend, m uint32) uint64 {
	sorted := slices.Clone(backends)
	slices.SortFunc(sorted, func(a, b Backend) int { return strings.Compare(a.Key, b.Key) })
	h := sha256.New()
	var b [12]byte
	binary.LittleEndian.PutUint32(b[0:], buildVersion)
	binary.LittleEndian.PutUint32(b[4:], m)
	binary.LittleEndian.PutUint32(b[8:], uint32(len(sorted)))
	h.Write(b[:])
	for _, be := range sorted {
		binary.LittleEndian.PutUint32(b[0:], be.ID)
		binary.LittleEndian.PutUint32(b[4:], be.Weight)
		binary.LittleEndian.PutUint32(b[8:], uint32(len(be.Key)))
		h.Write(b[:])
		h.Write([]byte(be.Key))
	}
	return binary.LittleEndian.Uint64(h.Sum(nil))
}

// Shares counts the slots each backend ID holds in table; lbctl shows it as
// each backend's share of a service's new flows.
func Shares(table []uint32) map[uint32]int {
	shares := make(map[uint32]int)
	for _, id := range table {
		shares[id]++
	}
	return shares
}
