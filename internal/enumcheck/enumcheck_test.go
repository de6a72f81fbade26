package enumcheck

import (
	"bytes"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// spec builds BTF holding one enum, as a compiled object would.
func spec(t *testing.T, e *btf.Enum) *btf.Spec {
	t.Helper()
	b, err := btf.NewBuilder([]btf.Type{e}, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := b.Marshal(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := btf.LoadSpecFromReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestNames(t *testing.T) {
	s := spec(t, &btf.Enum{Name: "color", Size: 4, Values: []btf.EnumValue{
		{Name: "RED", Value: 0}, {Name: "GREEN", Value: 1}, {Name: "BLUE", Value: 2}, {Name: "COLOR_MAX", Value: 3},
	}})
	for _, c := range []struct {
		name  string
		names map[uint64]string
		want  []string // substrings of the error; none: no error
	}{
		{"all named", map[uint64]string{0: "red", 1: "green", 2: "blue"}, nil},
		{"one missing", map[uint64]string{0: "red", 2: "blue"}, []string{"GREEN (1) has no Go name"}},
		{"empty name", Table([]string{"red", "", "blue"}), []string{"GREEN (1) has no Go name"}},
		{"shared name", map[uint64]string{0: "red", 1: "red", 2: "blue"}, []string{`RED and GREEN have the same Go name "red"`}},
		{"name without value", map[uint64]string{0: "red", 1: "green", 2: "blue", 7: "cyan"}, []string{`Go name "cyan" is for 7`}},
		{"sentinel named", map[uint64]string{0: "red", 1: "green", 2: "blue", 3: "max"}, []string{`Go name "max" is for 3`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := Names(s, "color", c.names, "COLOR_MAX")
			if len(c.want) == 0 {
				if err != nil {
					t.Fatalf("Names: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Names: no error, want %q", c.want)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Names: %v, want it to say %q", err, w)
				}
			}
		})
	}
	if err := Names(s, "colour", nil); err == nil || !strings.Contains(err.Error(), "enum colour") {
		t.Errorf("Names of a missing enum: %v, want an error naming it", err)
	}
}

func TestMapSizes(t *testing.T) {
	spec := func(sizes map[string]uint32) *ebpf.CollectionSpec {
		c := &ebpf.CollectionSpec{Maps: map[string]*ebpf.MapSpec{}}
		for name, n := range sizes {
			c.Maps[name] = &ebpf.MapSpec{Name: name, MaxEntries: n}
		}
		return c
	}
	compiled := spec(map[string]uint32{"lb_ct4": 1024, "lb_affinity": 32768})
	if err := MapSizes(compiled, spec(map[string]uint32{"lb_ct4": 1024, "lb_affinity": 32768})); err != nil {
		t.Fatalf("equal sizes: %v", err)
	}
	err := MapSizes(compiled, spec(map[string]uint32{"lb_ct4": 1024, "lb_affinity": 65536}))
	if err == nil || err.Error() != "map lb_affinity: 65536 entries with the Go defaults, 32768 compiled in" {
		t.Fatalf("a size Go changed alone: %v", err)
	}
	err = MapSizes(compiled, spec(map[string]uint32{"lb_ct4": 1024}))
	if err == nil || !strings.Contains(err.Error(), "map lb_affinity: compiled in, not in the sized spec") {
		t.Fatalf("a map Go does not size: %v", err)
	}
}
