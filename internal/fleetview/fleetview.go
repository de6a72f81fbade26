// Package fleetview compares the service digests of LB nodes: the services whose digests
// are not the same on every node are the ones on which the nodes may send a flow to
// different backends. lbd uses it for its fleet view and metric, lbctl for fleet check.
package fleetview

import (
	"slices"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// Node is one node's digests.
type Node struct {
	Name    string
	Digests []*lbdv1.ServiceDigest
}

// Diverged returns the services whose digests differ between the nodes, or that some
// node does not hold, sorted by name, each with every node's digest (an empty one where
// the node lacks the service). With fewer than two nodes nothing diverges.
func Diverged(nodes []Node) []*lbdv1.DivergedService {
	if len(nodes) < 2 {
		return nil
	}
	per := make([]map[string]*lbdv1.ServiceDigest, len(nodes))
	names := map[string]bool{}
	for i, n := range nodes {
		per[i] = make(map[string]*lbdv1.ServiceDigest, len(n.Digests))
		for _, d := range n.Digests {
			per[i][d.Name] = d
			names[d.Name] = true
		}
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	slices.Sort(sorted)
	var out []*lbdv1.DivergedService
	for _, name := range sorted {
		first := per[0][name]
		same := true
		for i := 1; i < len(nodes) && same; i++ {
			same = equal(first, per[i][name])
		}
		if same {
			continue
		}
		ds := &lbdv1.DivergedService{Name: name}
		for i, n := range nodes {
			d := per[i][name]
			if d == nil {
				d = &lbdv1.ServiceDigest{Name: name}
			}
			ds.Digests = append(ds.Digests, &lbdv1.NodeDigest{Node: n.Name, Digest: d})
		}
		out = append(out, ds)
	}
	return out
}

func equal(a, b *lbdv1.ServiceDigest) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Table == b.Table && a.Spec == b.Spec
}
