// Package maglev computes the per-service Maglev lookup tables that the LB
// node's XDP program indexes with a flow hash.
//
// The permutations come from github.com/dgryski/go-maglev; this package adds
// what the datapath needs around it: weights, a canonical input order,
// validation, and a table of stable backend IDs instead of list indexes.
//
// Determinism: every LB node must build the same table from the same backend
// set, or a flow moved by the router to another node lands on another backend.
// go-maglev's table depends on the order of its input (TESTBED.md measured 11
// of 65537 slots differing for the same three names in another order), so the
// entry names are sorted bytewise before they are handed over. That order is
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
// permutations only visit every slot when M is prime.
//
// M trades memory and build time against disruption, the share of other
// backends' slots that move when one backend leaves (DESIGN §3 asks ≤ 1%).
// Measured worst case over removals, equal weights:
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
	// MaxTableSize caps one table at 512 KiB of uint32 backend IDs and a
	// build at about 11 ms, so a backend change still reaches the datapath
	// quickly.
	MaxTableSize = 131071
	// DefaultTableSize is the smallest of the usual sizes that keeps
	// disruption under 1% from 10 to 1000 backends, at 256 KiB per service.
	// Deployments with very many small services can choose 16381 (64 KiB)
	// and accept more disruption beyond a few dozen backends.
	DefaultTableSize = 65537
)

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
	if err := Validate(backends, m); err != nil {
		return nil, err
	}
	if len(backends) == 0 {
		return nil, ErrNoBackends
	}

	type entry struct {
		name string
		id   uint32
	}
	var n int
	for _, b := range backends {
		n += int(b.Weight)
	}
	entries := make([]entry, 0, n)
	for _, b := range backends {
		entries = append(entries, entry{b.Key, b.ID})
		for r := uint32(2); r <= b.Weight; r++ {
			entries = append(entries, entry{b.Key + ReplicaSeparator + strconv.FormatUint(uint64(r), 10), b.ID})
		}
	}
	// Validate made every name unique, so this order is total.
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.name, b.name) })

	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.name
	}
	t := gomaglev.New(names, uint64(m))
	table := make([]uint32, m)
	for i := range table {
		table[i] = entries[t.Lookup(uint64(i))].id
	}
	return table, nil
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
