package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

// TestFieldDocs checks which undocumented fields share the comment above them.
func TestFieldDocs(t *testing.T) {
	src := `package p
type S struct {
	// A is documented alone.
	A int
	B int
	// GC bounds the interval.
	GCMin int
	GCMax int
	// Size is the table's size; NATSize the other's.
	Size    int
	NATSize int

	Loose int
	// Acronym X is alone.
	X int
	Y int ` + "`json:\"y\"`" + ` // trailing comment
}`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	st := f.Decls[0].(*ast.GenDecl).Specs[0].(*ast.TypeSpec).Type.(*ast.StructType)
	got := fieldDocs(fset, st)
	want := map[string]string{
		"A": "A is documented alone.", "B": "",
		"GCMin": "GC bounds the interval.", "GCMax": "GC bounds the interval.",
		"Size": "Size is the table's size; NATSize the other's.", "NATSize": "Size is the table's size; NATSize the other's.",
		"Loose": "", "X": "Acronym X is alone.", "Y": "trailing comment",
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("field %s: doc %q, want %q", k, got[k], w)
		}
	}
}

// TestConfigReference checks rows of the real configuration: nested keys, defaults
// from config.Default(), shared comments with keys substituted, and list sections.
func TestConfigReference(t *testing.T) {
	out, err := configReference("../../..")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(out)
	for _, row := range []string{
		"| `datapath.nat_size` | uint32 | `262144` | `conntrack_size` is the LB conntrack table's size in flows (its maps hold a quarter more, headroom the collector gives back); `nat_size` the backend's. |",
		"| `api.socket` | string | `\"/run/lbd/lbd.sock\"` |",
		"| `limits.max_backends` | int | `262143` |",
		"| `datapath.gc_max_interval` | duration | `\"1m0s\"` |",
		"| `bgp` | object (optional) | absent |",
		"| `bgp.peers[].graceful_restart.restart_time` | duration | — |",
		"| `bgp.vip_attributes[].med` | uint32 (optional) | — |",
	} {
		if !strings.Contains(doc, row) {
			t.Errorf("config.md lacks the row %q", row)
		}
	}
}
