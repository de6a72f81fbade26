//go:build linux

package lbxdp

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// The datapath keeps two indexes beside lb_vips and lb_services, written only
// by this package:
//
//   - lb_vip_filter, one bit per bucket of destination addresses, set when a
//     VIP address falls in it: most traffic that is not for a VIP is passed
//     on a clear bit, without a hash map lookup. A bit is set before its VIP
//     is added and cleared after the last VIP of the bucket is removed.
//   - lb_svc_by_id, every service with its key by ID: a packet of an
//     established flow whose service still has exactly that destination as
//     key skips the lb_vips and lb_services lookups.
//
// Both are rebuilt from lb_vips and lb_services at Load, so maps adopted from
// an earlier version, which had neither, get them.

// vipFilterOrder is log2 of the number of filter buckets: LB_VIP_FILTER_ORDER, which
// TestConstantsAsCompiled compares it with.
const vipFilterOrder = 16

// vipBucket is lb_vip_bucket of lbxdp.c: the XOR of the address's 32-bit
// words as the little-endian BPF target loads them, and the family,
// multiplied by LB_VIP_FILTER_MUL, top vipFilterOrder bits.
func vipBucket(addr [16]byte, family uint8) uint32 {
	x := binary.LittleEndian.Uint32(addr[0:]) ^ binary.LittleEndian.Uint32(addr[4:]) ^
		binary.LittleEndian.Uint32(addr[8:]) ^ binary.LittleEndian.Uint32(addr[12:]) ^ uint32(family)
	return (x * 0x9e3779b1) >> (32 - vipFilterOrder)
}

// vipFilter mirrors lb_vip_filter with a count of VIPs per bucket, so that a
// removal knows whether the bucket's bit must stay.
type vipFilter struct {
	count map[uint32]int
	bits  lbxdpLbVipBitmap
}

func (f *vipFilter) add(b uint32, delta int) (changed bool) {
	if f.count == nil {
		f.count = make(map[uint32]int)
	}
	n := f.count[b] + delta
	if n <= 0 {
		delete(f.count, b)
	} else {
		f.count[b] = n
	}
	byteIdx, mask := b>>3, uint8(1)<<(b&7)
	was := f.bits.Bits[byteIdx]&mask != 0
	if n > 0 {
		f.bits.Bits[byteIdx] |= mask
	} else {
		f.bits.Bits[byteIdx] &^= mask
	}
	return was != (n > 0)
}

func (d *Datapath) writeFilter() error {
	if err := d.update(d.objs.LbVipFilter, uint32(0), &d.filter.bits, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write vip filter: %w", err)
	}
	return nil
}

// filterVIP counts a VIP address in or (delta -1) out of the filter.
func (d *Datapath) filterVIP(k lbxdpLbVipKey, delta int) error {
	if d.filter.add(vipBucket(k.Addr, k.Family), delta) {
		return d.writeFilter()
	}
	return nil
}

// indexService records in lb_svc_by_id that service v has key k.
func (d *Datapath) indexService(k lbxdpLbServiceKey, v lbxdpLbService) error {
	e := lbxdpLbSvcEntry{Key: k, Svc: v}
	if err := d.update(d.objs.LbSvcById, v.Id, &e, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("index service %d: %w", v.Id, err)
	}
	return nil
}

// unindexService clears lb_svc_by_id's entry for id if it still holds key k:
// while a service moves to a new key under the same ID, the entry already
// holds the new key.
func (d *Datapath) unindexService(id uint32, k lbxdpLbServiceKey) error {
	var e lbxdpLbSvcEntry
	if err := d.objs.LbSvcById.Lookup(id, &e); err != nil {
		return fmt.Errorf("read service index %d: %w", id, err)
	}
	if e.Key != k {
		return nil
	}
	if err := d.update(d.objs.LbSvcById, id, &lbxdpLbSvcEntry{}, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("clear service index %d: %w", id, err)
	}
	return nil
}

// rebuildIndexes derives lb_vip_filter and lb_svc_by_id from lb_vips and
// lb_services, writing only what differs from what they hold.
func (d *Datapath) rebuildIndexes() error {
	d.filter = vipFilter{}
	var vk lbxdpLbVipKey
	var v lbxdpLbVip
	it := d.objs.LbVips.Iterate()
	for it.Next(&vk, &v) {
		d.filter.add(vipBucket(vk.Addr, vk.Family), 1)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("rebuild vip filter: %w", err)
	}
	var bits lbxdpLbVipBitmap
	if err := d.objs.LbVipFilter.Lookup(uint32(0), &bits); err != nil {
		return fmt.Errorf("rebuild vip filter: %w", err)
	}
	if bits != d.filter.bits {
		if err := d.writeFilter(); err != nil {
			return err
		}
	}

	n := d.objs.LbSvcById.MaxEntries()
	want := make([]lbxdpLbSvcEntry, n)
	var sk lbxdpLbServiceKey
	var sv lbxdpLbService
	sit := d.objs.LbServices.Iterate()
	for sit.Next(&sk, &sv) {
		if sv.Id < n {
			want[sv.Id] = lbxdpLbSvcEntry{Key: sk, Svc: sv}
		}
	}
	if err := sit.Err(); err != nil {
		return fmt.Errorf("rebuild service index: %w", err)
	}
	have, err := readArray[lbxdpLbSvcEntry](d.objs.LbSvcById, d.objs.LbSvcById.MaxEntries())
	if err != nil {
		return fmt.Errorf("rebuild service index: %w", err)
	}
	var ids []uint32
	var entries []lbxdpLbSvcEntry
	for id := range want {
		if have[id] != want[id] {
			ids = append(ids, uint32(id))
			entries = append(entries, want[id])
		}
	}
	if len(ids) == 0 {
		return nil
	}
	if _, err := d.objs.LbSvcById.BatchUpdate(ids, entries, nil); err != nil {
		return fmt.Errorf("rebuild service index: %w", err)
	}
	d.writes.Add(uint64(len(ids)))
	return nil
}

// readArray reads the first n values of an array map in batches, by index.
func readArray[V any](m *ebpf.Map, n uint32) ([]V, error) {
	keys := make([]uint32, n)
	vals := make([]V, n)
	var cursor ebpf.MapBatchCursor
	got := 0
	for got < int(n) {
		c, err := m.BatchLookup(&cursor, keys[got:], vals[got:], nil)
		got += c
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if got != int(n) {
		return nil, fmt.Errorf("read %d of %d entries", got, n)
	}
	return vals, nil
}
