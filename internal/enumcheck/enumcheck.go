// Package enumcheck checks that a BPF object and the Go side that loads it agree on
// what both state: an enum of the object's BTF against the names Go gives its values
// (bpf2go generates the values; the names of reasons, counters and states in
// statistics and metrics are Go's own, and this tells a value the C side added, and
// Go did not name, from one both know), and the map sizes compiled into the object
// against the defaults Go applies (MapSizes).
package enumcheck

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// MapSizes checks that every map of compiled (the object as built) has the same
// number of entries in sized (the spec as Go sizes it when given no option): a size
// written in C apart from the enum Go reads its defaults from, or a default Go no
// longer applies, is an error. The error lists every mismatch.
func MapSizes(compiled, sized *ebpf.CollectionSpec) error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(compiled.Maps)) {
		m, s := compiled.Maps[name], sized.Maps[name]
		if s == nil {
			errs = append(errs, fmt.Errorf("map %s: compiled in, not in the sized spec", name))
		} else if s.MaxEntries != m.MaxEntries {
			errs = append(errs, fmt.Errorf("map %s: %d entries with the Go defaults, %d compiled in", name, s.MaxEntries, m.MaxEntries))
		}
	}
	return errors.Join(errs...)
}

// Names checks that every value of the enum called enum in spec has exactly one Go
// name in names (keyed by value), that no two values share a name, and that every
// key of names is a value of the enum. Values whose C name is in omit (a sentinel
// such as LB_DROP_MAX) need no Go name. The error lists every mismatch.
func Names(spec *btf.Spec, enum string, names map[uint64]string, omit ...string) error {
	var e *btf.Enum
	if err := spec.TypeByName(enum, &e); err != nil {
		return fmt.Errorf("enum %s: %w", enum, err)
	}
	var errs []error
	inC := make(map[uint64]bool, len(e.Values))
	byName := make(map[string]string, len(names))
	for _, v := range e.Values {
		if slices.Contains(omit, v.Name) {
			continue
		}
		inC[v.Value] = true
		n, ok := names[v.Value]
		switch {
		case !ok || n == "":
			errs = append(errs, fmt.Errorf("enum %s: %s (%d) has no Go name", enum, v.Name, v.Value))
		case byName[n] != "":
			errs = append(errs, fmt.Errorf("enum %s: %s and %s have the same Go name %q", enum, byName[n], v.Name, n))
		default:
			byName[n] = v.Name
		}
	}
	for v, n := range names {
		if !inC[v] {
			errs = append(errs, fmt.Errorf("enum %s: Go name %q is for %d, which the enum does not have", enum, n, v))
		}
	}
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errors.Join(errs...)
}

// Table turns a name table indexed by value (an array keyed by the generated
// constants) into the map Names takes; empty entries are left out, so that a value
// the table does not name shows as missing.
func Table(names []string) map[uint64]string {
	out := make(map[uint64]string, len(names))
	for i, n := range names {
		if n != "" {
			out[uint64(i)] = n
		}
	}
	return out
}
