//go:build linux

package datapath

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"net/netip"
	"slices"

	"github.com/lbd-dev/lbd/bpf/lbxdp"
)

// DigestLen is the length in bytes of a digest before hex encoding: 64 bits tell a few
// nodes' tables apart with no practical chance of a collision, and keep a node's digests
// of ten thousand services small enough for one etcd value.
const DigestLen = 8

// TableDigests hashes what the LB maps hold for every service, read back from the maps
// (not from what lbd meant to write): the flow hash seed, the service entry and its
// source ranges, and the Maglev table with each slot written as its backend's address,
// port and node, so that two nodes whose tables send every new flow to the same backend
// have the same digest whatever IDs they use. Services are named as the desired state
// names them; one the maps hold without being desired is "#ID". A node without LB maps
// returns nil.
func (m *Manager) TableDigests() (map[string]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lb == nil {
		return nil, nil
	}
	cfg, err := m.lb.Config()
	if err != nil {
		return nil, err
	}
	services, err := m.lb.Services()
	if err != nil {
		return nil, err
	}
	backends, err := m.lb.Backends()
	if err != nil {
		return nil, err
	}
	ranges, err := m.lb.SourceRanges()
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(services))
	for key, svc := range services {
		table, err := m.lb.MaglevTable(svc.ID)
		if err != nil {
			return nil, fmt.Errorf("service ID %d: %w", svc.ID, err)
		}
		name := fmt.Sprintf("#%d", svc.ID)
		if p := m.programmed[svc.ID]; p != nil && p.key == key {
			name = p.name
		}
		out[name] = tableDigest(cfg.HashSeed, key, svc, ranges[svc.ID], table, backends)
	}
	return out, nil
}

// tableDigest hashes one service's entry, source ranges and table.
func tableDigest(seed uint32, key lbxdp.ServiceKey, svc lbxdp.Service, ranges []netip.Prefix, table []uint32, backends map[uint32]lbxdp.Backend) string {
	h := sha256.New()
	fmt.Fprintf(h, "seed %d\nfrontend %s\nhash %d drop %t affinity %d\n", seed, keyString(key), svc.HashMode, svc.DropNoBackend, svc.AffinityTimeout)
	rs := make([]string, 0, len(ranges))
	for _, r := range ranges {
		rs = append(rs, r.String())
	}
	slices.Sort(rs)
	fmt.Fprintf(h, "ranges %t %v\n", svc.SourceRanges, rs)
	writeTable(h, table, backends)
	return hex.EncodeToString(h.Sum(nil)[:DigestLen])
}

// writeTable writes a table as the list of its backends in order of first appearance,
// then each slot as an index into that list: the same for equal tables whatever the
// backend IDs, and cheap to hash for 65,537 slots.
func writeTable(h hash.Hash, table []uint32, backends map[uint32]lbxdp.Backend) {
	index := map[uint32]uint32{}
	slots := make([]byte, 4*len(table))
	for i, id := range table {
		n, ok := index[id]
		if !ok {
			n = uint32(len(index))
			index[id] = n
			if b, ok := backends[id]; ok {
				fmt.Fprintf(h, "backend %d %s>%s\n", n, netip.AddrPortFrom(b.Addr, b.Port), b.Node)
			} else {
				fmt.Fprintf(h, "backend %d missing ID %d\n", n, id)
			}
		}
		binary.BigEndian.PutUint32(slots[4*i:], n)
	}
	fmt.Fprintf(h, "slots %d\n", len(table))
	h.Write(slots)
}
