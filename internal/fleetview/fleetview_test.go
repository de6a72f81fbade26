package fleetview

import (
	"strings"
	"testing"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

func d(name, table, spec string) *lbdv1.ServiceDigest {
	return &lbdv1.ServiceDigest{Name: name, Table: table, Spec: spec}
}

func TestDiverged(t *testing.T) {
	a := Node{Name: "a", Digests: []*lbdv1.ServiceDigest{d("same", "1", "2"), d("table", "1", "2"), d("spec", "1", "2"), d("only-a", "1", "2")}}
	b := Node{Name: "b", Digests: []*lbdv1.ServiceDigest{d("same", "1", "2"), d("table", "9", "2"), d("spec", "1", "9")}}
	got := Diverged([]Node{a, b})
	var names []string
	for _, s := range got {
		names = append(names, s.Name)
		if len(s.Digests) != 2 || s.Digests[0].Node != "a" || s.Digests[1].Node != "b" {
			t.Errorf("%s: digests %v, want one per node in order", s.Name, s.Digests)
		}
	}
	if want := "only-a,spec,table"; strings.Join(names, ",") != want {
		t.Errorf("diverged %v, want %s", names, want)
	}
	if got[0].Digests[1].Digest.Table != "" || got[0].Digests[1].Digest.Name != "only-a" {
		t.Errorf("the node without the service: %v, want an empty digest", got[0].Digests[1])
	}
	if g := Diverged([]Node{a}); g != nil {
		t.Errorf("one node: %v, want nothing", g)
	}
	if g := Diverged([]Node{a, a, a}); g != nil {
		t.Errorf("three equal nodes: %v", g)
	}
}
