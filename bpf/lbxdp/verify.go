//go:build linux

package lbxdp

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// VerifyIndexes reads lb_vips, lb_svc_by_id and lb_vip_filter back and compares
// them with what lb_services implies (they are this package's derived state, see
// vipindex.go). Anything that differs, written there by something other than this
// Datapath, is repaired; the returned lines say what was wrong.
func (d *Datapath) VerifyIndexes() ([]string, error) {
	var diffs []string
	want := map[lbxdpLbVipKey]lbxdpLbVip{}
	byID := map[uint32]lbxdpLbSvcEntry{}
	var sk lbxdpLbServiceKey
	var sv lbxdpLbService
	it := d.objs.LbServices.Iterate()
	for it.Next(&sk, &sv) {
		vk := lbxdpLbVipKey{Addr: sk.Addr, Family: sk.Family}
		v := want[vk]
		v.Services++
		if sk.Port == 0 {
			v.addWild(sk.Proto, 1)
		}
		want[vk] = v
		byID[sv.Id] = lbxdpLbSvcEntry{Key: sk, Svc: sv}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("verify indexes: read services: %w", err)
	}

	have := map[lbxdpLbVipKey]lbxdpLbVip{}
	var vk lbxdpLbVipKey
	var v lbxdpLbVip
	vit := d.objs.LbVips.Iterate()
	for vit.Next(&vk, &v) {
		have[vk] = v
	}
	if err := vit.Err(); err != nil {
		return nil, fmt.Errorf("verify indexes: read vips: %w", err)
	}
	for k, w := range want {
		if h, ok := have[k]; !ok || h != w {
			diffs = append(diffs, fmt.Sprintf("vip %s: %+v, want %+v", bytesAddr(k.Addr, k.Family), h, w))
			if err := d.update(d.objs.LbVips, &k, &w, ebpf.UpdateAny); err != nil {
				return diffs, fmt.Errorf("repair vip: %w", err)
			}
		}
	}
	for k := range have {
		if _, ok := want[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("vip %s: present without a service", bytesAddr(k.Addr, k.Family)))
			if err := d.delete(d.objs.LbVips, &k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return diffs, fmt.Errorf("repair vip: %w", err)
			}
		}
	}

	index, err := readArray[lbxdpLbSvcEntry](d.objs.LbSvcById, d.objs.LbSvcById.MaxEntries())
	if err != nil {
		return diffs, fmt.Errorf("verify indexes: read service index: %w", err)
	}
	for i, e := range index {
		id := uint32(i)
		w := byID[id]
		if e != w {
			diffs = append(diffs, fmt.Sprintf("service index %d does not match lb_services", id))
			if err := d.update(d.objs.LbSvcById, id, &w, ebpf.UpdateAny); err != nil {
				return diffs, fmt.Errorf("repair service index: %w", err)
			}
		}
	}

	var bits lbxdpLbVipBitmap
	if err := d.objs.LbVipFilter.Lookup(uint32(0), &bits); err != nil {
		return diffs, fmt.Errorf("verify indexes: read vip filter: %w", err)
	}
	d.filter = vipFilter{}
	for k := range want {
		d.filter.add(vipBucket(k.Addr, k.Family), 1)
	}
	if bits != d.filter.bits {
		diffs = append(diffs, "vip filter bits do not match the VIPs")
		if err := d.writeFilter(); err != nil {
			return diffs, err
		}
	}
	return diffs, nil
}

// Backends returns every backend in use, by ID, read in batches.
func (d *Datapath) Backends() (map[uint32]Backend, error) {
	vals, err := readArray[lbxdpLbBackend](d.objs.LbBackends, d.objs.LbBackends.MaxEntries())
	if err != nil {
		return nil, fmt.Errorf("read backends: %w", err)
	}
	out := map[uint32]Backend{}
	for id, v := range vals {
		if v.Family != 0 {
			out[uint32(id)] = Backend{Addr: bytesAddr(v.Addr, v.Family), Port: htons(v.Port), Node: bytesAddr(v.NodeAddr, v.NodeFamily)}
		}
	}
	return out, nil
}

// TableMapMemlock is the kernel memory (memlock) of a service's current table map.
func (d *Datapath) TableMapMemlock(serviceID uint32) (uint64, error) {
	inner, err := d.tableMap(serviceID)
	if err != nil || inner == nil {
		return 0, err
	}
	defer inner.Close()
	info, err := inner.Info()
	if err != nil {
		return 0, fmt.Errorf("read table info: %w", err)
	}
	n, _ := info.Memlock()
	return n, nil
}
