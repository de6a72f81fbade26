// Package enumcheck compares an enum of a BPF object's BTF with the names the Go side
// gives its values. bpf2go generates the values; the names (of reasons, counters,
// states in statistics and metrics) are Go's own, and this is what tells a value the
// C side added, and Go did not name, from one both know.
package enumcheck

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cilium/ebpf/btf"
)

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
