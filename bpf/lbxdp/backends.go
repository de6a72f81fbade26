//go:build linux

package lbxdp

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
)

// Backend is where a backend ID sends traffic.
type Backend struct {
	// Addr is the backend's address: the inner packet's new destination. Its
	// family must be the family of the VIPs it serves.
	Addr netip.Addr
	// Port is the backend's port; 0 keeps the client's destination port (for
	// services on all ports).
	Port uint16
	// Node is the address of the node hosting the backend: the outer
	// destination. IPv4 and IPv6 underlays both work, whatever Addr's family.
	Node netip.Addr
}

func (d *Datapath) checkBackendID(id uint32) error {
	if id == 0 || id >= d.opts.MaxBackends {
		return fmt.Errorf("backend ID %d: %w", id, ErrRange)
	}
	return nil
}

func (d *Datapath) backendRaw(id uint32, b Backend) (lbxdpLbBackend, error) {
	if err := d.checkBackendID(id); err != nil {
		return lbxdpLbBackend{}, err
	}
	addr, fam, err := addrBytes(b.Addr)
	if err != nil {
		return lbxdpLbBackend{}, err
	}
	node, nfam, err := addrBytes(b.Node)
	if err != nil {
		return lbxdpLbBackend{}, fmt.Errorf("node: %w", err)
	}
	return lbxdpLbBackend{Addr: addr, NodeAddr: node, Port: htons(b.Port), Family: fam, NodeFamily: nfam}, nil
}

// UpsertBackend creates or replaces a backend. ID 0 is reserved for "none".
func (d *Datapath) UpsertBackend(id uint32, b Backend) error {
	v, err := d.backendRaw(id, b)
	if err != nil {
		return fmt.Errorf("upsert backend: %w", err)
	}
	if err := d.update(d.objs.LbBackends, id, &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("upsert backend: %w", err)
	}
	return nil
}

// UpsertBackends creates or replaces several backends with one batch update.
func (d *Datapath) UpsertBackends(bs map[uint32]Backend) error {
	if len(bs) == 0 {
		return nil
	}
	ids := slices.Sorted(maps.Keys(bs))
	vals := make([]lbxdpLbBackend, len(ids))
	for i, id := range ids {
		v, err := d.backendRaw(id, bs[id])
		if err != nil {
			return fmt.Errorf("upsert backends: %w", err)
		}
		vals[i] = v
	}
	if _, err := d.objs.LbBackends.BatchUpdate(ids, vals, nil); err != nil {
		return fmt.Errorf("upsert %d backends: %w", len(ids), err)
	}
	d.writes.Add(uint64(len(ids)))
	return nil
}

// DeleteBackend removes a backend: flows pinned to it by conntrack or affinity
// are balanced again on their next packet. (To drain instead, keep the backend
// and only leave it out of the Maglev tables.)
func (d *Datapath) DeleteBackend(id uint32) error {
	if err := d.checkBackendID(id); err != nil {
		return fmt.Errorf("delete backend: %w", err)
	}
	if err := d.update(d.objs.LbBackends, id, &lbxdpLbBackend{}, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("delete backend: %w", err)
	}
	return nil
}

// Backend returns a backend; ok is false when the ID is unused.
func (d *Datapath) Backend(id uint32) (b Backend, ok bool, err error) {
	if err := d.checkBackendID(id); err != nil {
		return Backend{}, false, fmt.Errorf("read backend: %w", err)
	}
	var v lbxdpLbBackend
	if err := d.objs.LbBackends.Lookup(id, &v); err != nil {
		return Backend{}, false, fmt.Errorf("read backend: %w", err)
	}
	if v.Family == 0 {
		return Backend{}, false, nil
	}
	return Backend{Addr: bytesAddr(v.Addr, v.Family), Port: htons(v.Port), Node: bytesAddr(v.NodeAddr, v.NodeFamily)}, true, nil
}
