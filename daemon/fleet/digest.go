// Package fleet is what an LB node tells the other nodes of its fleet about itself and
// what it knows of them: a digest of each service as its datapath holds it and as its
// desired state says, its registration under a lease in the etcd store, and the view of
// every registered node that `lbctl fleet status` and lbd_fleet_diverged_services show.
package fleet

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"slices"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/proto"
)

// digestLen is the length of a digest in bytes, as datapath.DigestLen.
const digestLen = 8

// SpecDigest hashes a service's spec: frontend, options and backends (address, port,
// node, weight, state), without what differs between nodes for the same spec (IDs,
// revision, status, the backends' output-only fields) or does not reach the datapath
// (the owner).
func SpecDigest(svc *lbdv1.Service) string {
	spec := proto.Clone(svc).(*lbdv1.Service)
	spec.Id, spec.Revision, spec.Status, spec.Owner = 0, 0, nil, ""
	for _, b := range spec.Backends {
		b.Id, b.Health, b.TableSlots, b.NodeReachability = 0, nil, 0, lbdv1.Reachability_REACHABILITY_UNSPECIFIED
	}
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(spec)
	if err != nil {
		// A Service always marshals; an empty digest would show as a divergence.
		return ""
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:digestLen])
}

// Digests joins the desired services with the digests of what the datapath holds
// (by name, as datapath.Manager.TableDigests returns them), sorted by name.
func Digests(svcs []*lbdv1.Service, tables map[string]string) []*lbdv1.ServiceDigest {
	byName := make(map[string]*lbdv1.ServiceDigest, len(svcs))
	for _, svc := range svcs {
		byName[svc.Name] = &lbdv1.ServiceDigest{Name: svc.Name, Spec: SpecDigest(svc), Table: tables[svc.Name]}
	}
	for name, table := range tables {
		if _, ok := byName[name]; !ok {
			byName[name] = &lbdv1.ServiceDigest{Name: name, Table: table}
		}
	}
	out := slices.Collect(maps.Values(byName))
	slices.SortFunc(out, func(a, b *lbdv1.ServiceDigest) int { return cmp.Compare(a.Name, b.Name) })
	return out
}
