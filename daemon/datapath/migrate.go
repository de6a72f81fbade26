//go:build linux

package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// A pinned map whose size or layout changed at a restart is rebuilt while the old
// programs keep forwarding, and writing their map:
//
//  1. planMigrations moves the old pin aside (<name>_migrating), so that the new
//     programs load with a new map;
//  2. copy, before the switch, copies the old map's entries into the new one;
//  3. the manager points the pinned links (and socket hooks) at the new programs;
//  4. finish copies again, for what the old programs wrote between 2 and 3, and only
//     then removes the old pin.
//
// The copies read with batch lookups, which walk a hash map bucket by bucket under the
// bucket's lock: entries the old programs insert or evict meanwhile never make the walk
// start over or give up, as a key-by-key iteration does when its cursor is evicted
// (ErrIterationAborted, most entries lost). The first copy writes the new map in
// batches, as nothing else writes it yet; the second entry by entry with BPF_NOEXIST,
// so that an entry the new programs already wrote, newer, stays. A pin left aside by a
// start that did not get to 4 (a crash) is found by the next start and finished the
// same way.

// migratingSuffix names a pin moved aside; a second one of the same map (moved aside
// while an interrupted migration's pin was still there) gets a number after it.
const migratingSuffix = "_migrating"

// migration is a pinned map being rebuilt: the new map at newPath, filled from the old
// maps moved aside.
type migration struct {
	name, newPath string
	olds          []oldMap
	// fresh: the new programs created the new map (rather than adopting the current
	// one, when only an interrupted migration's pins are left to copy).
	fresh bool
	// total adds up both copies, for the log.
	total copyStats
}

// oldMap is a pin moved aside.
type oldMap struct {
	path string
	// copyable is false when the layout changed: the old map is dropped, which is only
	// allowed for maps the daemon fills from desired state (Sync rewrites them).
	copyable bool
}

// layoutChanged reports whether an old map is dropped rather than copied.
func (mg *migration) layoutChanged() bool {
	return slices.ContainsFunc(mg.olds, func(o oldMap) bool { return !o.copyable })
}

// copyStats counts what a copy did with the old entries: written into the new map,
// present there already (a newer entry of the new programs, or copied by the first
// pass), or lost because they did not fit.
type copyStats struct{ copied, present, lost int }

func (s *copyStats) add(o copyStats) {
	s.copied += o.copied
	s.present += o.present
	s.lost += o.lost
}

// planMigrations checks every pinned map of spec in dir and moves aside those that must
// be rebuilt; pins an interrupted migration left aside are taken up again. Maps in
// learned hold state only the datapath knows (conntrack, NAT): a layout change there is
// an error, reported before anything is moved.
func planMigrations(dir string, spec *ebpf.CollectionSpec, learned map[string]bool, log hclog.Logger) ([]*migration, error) {
	aside, err := pinsAside(dir)
	if err != nil {
		return nil, err
	}
	type move struct{ name, from, to string }
	var moves []move
	var out []*migration
	for name, ms := range spec.Maps {
		if ms.Pinning != ebpf.PinByName {
			continue
		}
		mg := &migration{name: name, newPath: filepath.Join(dir, name)}
		fits := make([]pinFit, 0, len(aside[name]))
		for _, i := range aside[name] {
			f, err := fitPinned(asidePath(mg.newPath, i), ms)
			if err != nil {
				return nil, fmt.Errorf("open pinned map %s: %w", name, err)
			}
			fits = append(fits, f)
		}
		cur, err := fitPinned(mg.newPath, ms)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// Interrupted before the new map was pinned: the map moved aside last is
			// the one the attached programs still use. It fits (the size was set back):
			// it is the current map again.
			if n := len(fits); n > 0 && fits[n-1].incompatible == nil {
				moves = append(moves, move{name, fits[n-1].path, mg.newPath})
				fits = fits[:n-1]
			} else {
				mg.fresh = true
			}
		case err != nil:
			return nil, fmt.Errorf("open pinned map %s: %w", name, err)
		case cur.incompatible != nil:
			next := 1
			if n := len(aside[name]); n > 0 {
				next = aside[name][n-1] + 1
			}
			cur.path = asidePath(mg.newPath, next)
			moves = append(moves, move{name, mg.newPath, cur.path})
			fits = append(fits, cur)
			mg.fresh = true
		}
		for _, f := range fits {
			if !f.copyable && learned[name] {
				return nil, fmt.Errorf("pinned map %s changed layout (%v): its entries cannot be carried over; "+
					"run the previous lbd, or `lbd --detach` to start empty (established flows are lost)", name, f.incompatible)
			}
			mg.olds = append(mg.olds, oldMap{path: f.path, copyable: f.copyable})
		}
		if len(mg.olds) > 0 {
			out = append(out, mg)
		}
		if len(aside[name]) > 0 {
			log.Warn("an earlier start stopped in the middle of migrating this map; finishing it",
				"op", "migrate", "map", name, "pins_aside", len(aside[name]))
		}
	}
	for _, mv := range moves {
		if err := os.Rename(mv.from, mv.to); err != nil {
			return nil, fmt.Errorf("move pinned map %s: %w", mv.name, err)
		}
	}
	return out, nil
}

// pinFit is how a pinned map fits its spec: compatible (incompatible == nil) is adopted
// as it is; copyable (same type, key and value sizes) has entries that can be carried
// over into a new map.
type pinFit struct {
	path         string
	incompatible error
	copyable     bool
}

// fitPinned opens the map pinned at path; a missing pin is fs.ErrNotExist.
func fitPinned(path string, ms *ebpf.MapSpec) (pinFit, error) {
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return pinFit{}, err
	}
	defer m.Close()
	copyable := m.Type() == ms.Type && m.KeySize() == ms.KeySize && m.ValueSize() == ms.ValueSize
	return pinFit{path: path, incompatible: ms.Compatible(m), copyable: copyable}, nil
}

// asidePath is the i-th pin of the map at path moved aside, counting from 1.
func asidePath(path string, i int) string {
	if i == 1 {
		return path + migratingSuffix
	}
	return path + migratingSuffix + strconv.Itoa(i)
}

// pinsAside lists the pins moved aside in dir, by map name, in the order they were
// moved aside.
func pinsAside(dir string) (map[string][]int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list pinned maps: %w", err)
	}
	out := map[string][]int{}
	for _, e := range entries {
		name, num, ok := strings.Cut(e.Name(), migratingSuffix)
		if !ok || name == "" {
			continue
		}
		i := 1
		if num != "" {
			if i, err = strconv.Atoi(num); err != nil || i < 2 {
				continue
			}
		}
		out[name] = append(out[name], i)
	}
	for _, is := range out {
		slices.Sort(is)
	}
	return out, nil
}

// copy copies the entries of the old maps into the new one. Before the switch (after
// false) it carries the bulk; after it, what the old programs wrote in between.
func (mg *migration) copy(after bool) (copyStats, error) {
	var s copyStats
	to, err := ebpf.LoadPinnedMap(mg.newPath, nil)
	if err != nil {
		return s, fmt.Errorf("open new map %s: %w", mg.name, err)
	}
	defer to.Close()
	// Before the switch nothing but this copy writes a map the new programs created.
	exclusive := !after && mg.fresh
	copyable := 0
	for _, o := range mg.olds {
		if !o.copyable {
			continue
		}
		copyable++
		from, err := ebpf.LoadPinnedMap(o.path, nil)
		if err != nil {
			return s, fmt.Errorf("open old map %s: %w", mg.name, err)
		}
		cs, err := copyMap(from, to, exclusive)
		from.Close()
		s.add(cs)
		if err != nil {
			return s, fmt.Errorf("copy map %s: %w", mg.name, err)
		}
	}
	if exclusive && copyable == 1 && to.Type() == ebpf.LRUHash {
		// A full LRU map makes room by evicting, without an error: what the new map
		// holds says how many fit.
		held, err := countEntries(to)
		if err != nil {
			return s, fmt.Errorf("count map %s: %w", mg.name, err)
		}
		if evicted := s.copied - held; evicted > 0 {
			s.copied -= evicted
			s.lost += evicted
		}
	}
	mg.total.add(s)
	return s, nil
}

// finish copies what the old programs wrote until the switch and removes the old pins:
// the old maps go with the last program that uses them. Call it once every program
// that used them has been replaced.
func (mg *migration) finish() (copyStats, error) {
	s, err := mg.copy(true)
	if err != nil {
		return s, err
	}
	for _, o := range mg.olds {
		if err := os.Remove(o.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return s, fmt.Errorf("remove old map %s: %w", mg.name, err)
		}
	}
	return s, nil
}

// migrationBatch is how many entries one batch call moves.
const migrationBatch = 4096

// copyMap copies from's entries into to. Exclusive (nothing else writes to), entries
// go in whole batches. Otherwise each goes in on its own unless to holds its key
// already, as a newer entry of the new programs or an earlier copy: BPF_NOEXIST, which
// BPF_MAP_UPDATE_BATCH does not take.
func copyMap(from, to *ebpf.Map, exclusive bool) (copyStats, error) {
	switch from.Type() {
	case ebpf.PerCPUArray, ebpf.PerCPUHash, ebpf.LRUCPUHash:
		// Per-CPU counters are not worth a layout-aware copy: they restart from zero.
		return copyStats{}, nil
	case ebpf.Array, ebpf.ArrayOfMaps:
		// Every key of an array exists, so BPF_NOEXIST would write nothing; only the
		// daemon writes these, never the programs. Their values carry over into a new
		// map, and hold until the first Sync.
		if !exclusive {
			return copyStats{}, nil
		}
	}
	w := writer{m: to, flags: ebpf.UpdateNoExist, batch: exclusive}
	if exclusive {
		w.flags = ebpf.UpdateAny
	}
	if from.Type() == ebpf.ArrayOfMaps || from.Type() == ebpf.HashOfMaps {
		// Inner maps read back as IDs but are written as file descriptors, one by one;
		// only the daemon writes these maps, so a walk key by key sees no change.
		return copyIterating(from, w, true)
	}
	s, err := copyBatches(from, w)
	if errors.Is(err, ebpf.ErrNotSupported) && s == (copyStats{}) {
		// No batch lookups for this map type (an LPM trie): only the daemon writes
		// those, so a walk key by key sees no change.
		return copyIterating(from, w, false)
	}
	return s, err
}

// copyBatches reads with batch lookups.
func copyBatches(from *ebpf.Map, w writer) (copyStats, error) {
	var s copyStats
	buf := newBatchBuf(migrationBatch, int(from.KeySize()), int(from.ValueSize()))
	var cursor ebpf.MapBatchCursor
	for {
		n, err := from.BatchLookup(&cursor, buf.keys(0, buf.n), buf.values(0, buf.n), nil)
		if errors.Is(err, unix.ENOSPC) && buf.n < int(from.MaxEntries()) {
			// One hash bucket holds more entries than the buffer: the cursor still
			// points at that bucket, and a larger buffer reads it whole.
			buf = newBatchBuf(2*buf.n, buf.keySize, buf.valueSize)
			continue
		}
		done := errors.Is(err, ebpf.ErrKeyNotExist)
		if err != nil && !done {
			return s, fmt.Errorf("read old map: %w", err)
		}
		if err := w.write(buf, n, &s); err != nil {
			return s, err
		}
		if done {
			return s, nil
		}
	}
}

// writer writes copied entries into a map, in batches or one by one.
type writer struct {
	m     *ebpf.Map
	flags ebpf.MapUpdateFlags
	batch bool
}

// write writes the first n entries of buf. The kernel stops a batch at the first entry
// it refuses; the rest goes on from the next one.
func (w writer) write(buf *batchBuf, n int, s *copyStats) error {
	i := 0
	for w.batch && i < n {
		done, err := w.m.BatchUpdate(buf.keys(i, n), buf.values(i, n), nil)
		if err == nil {
			s.copied += n - i
			return nil
		}
		if errors.Is(err, ebpf.ErrNotSupported) {
			break
		}
		if done >= n-i {
			// Refused as a whole, before any entry.
			return fmt.Errorf("write new map: %w", err)
		}
		s.copied += done
		i += done
		// No room for entry i (a full hash map, a smaller array): lost, as the copy
		// goes on.
		s.lost++
		i++
	}
	for ; i < n; i++ {
		tally(w.m.Update(buf.key(i), buf.value(i), w.flags), s)
	}
	return nil
}

// tally adds the outcome of one entry's update to s.
func tally(err error, s *copyStats) {
	switch {
	case err == nil:
		s.copied++
	case errors.Is(err, ebpf.ErrKeyExist):
		s.present++
	default:
		s.lost++
	}
}

// copyIterating copies key by key, for maps without batch lookups.
func copyIterating(from *ebpf.Map, w writer, inner bool) (copyStats, error) {
	var s copyStats
	key := make([]byte, from.KeySize())
	val := make([]byte, from.ValueSize())
	it := from.Iterate()
	for it.Next(&key, &val) {
		tally(copyEntry(w.m, key, val, w.flags, inner), &s)
	}
	if err := it.Err(); err != nil {
		return s, fmt.Errorf("read old map: %w", err)
	}
	return s, nil
}

// copyEntry writes one entry.
func copyEntry(m *ebpf.Map, key, val []byte, flags ebpf.MapUpdateFlags, inner bool) error {
	var v any = val
	if inner {
		im, err := ebpf.NewMapFromID(ebpf.MapID(binary.NativeEndian.Uint32(val)))
		if err != nil {
			return fmt.Errorf("open inner map: %w", err)
		}
		defer im.Close()
		v = im
	}
	return m.Update(key, v, flags)
}

// countEntries counts the entries of a hash map.
func countEntries(m *ebpf.Map) (int, error) {
	buf := newBatchBuf(migrationBatch, int(m.KeySize()), int(m.ValueSize()))
	var cursor ebpf.MapBatchCursor
	total := 0
	for {
		n, err := m.BatchLookup(&cursor, buf.keys(0, buf.n), buf.values(0, buf.n), nil)
		if errors.Is(err, unix.ENOSPC) && buf.n < int(m.MaxEntries()) {
			buf = newBatchBuf(2*buf.n, buf.keySize, buf.valueSize)
			continue
		}
		total += n
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return total, nil
		}
		if err != nil {
			return total, fmt.Errorf("count entries: %w", err)
		}
	}
}

// batchBuf holds n keys and values of sizes known only at run time. The batch calls
// take one slice element per entry, so each is a slice of byte arrays of the map's key
// or value size (made with reflect), which the library hands to the kernel as it is.
type batchBuf struct {
	n, keySize, valueSize int
	kv, vv                reflect.Value
	kb, vb                []byte // the same memory, as bytes
}

func newBatchBuf(n, keySize, valueSize int) *batchBuf {
	b := &batchBuf{n: n, keySize: keySize, valueSize: valueSize}
	b.kv, b.kb = byteArrays(n, keySize)
	b.vv, b.vb = byteArrays(n, valueSize)
	return b
}

func byteArrays(n, size int) (reflect.Value, []byte) {
	s := reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(size, reflect.TypeFor[byte]())), n, n)
	return s, unsafe.Slice((*byte)(s.UnsafePointer()), n*size)
}

func (b *batchBuf) keys(i, j int) any   { return b.kv.Slice(i, j).Interface() }
func (b *batchBuf) values(i, j int) any { return b.vv.Slice(i, j).Interface() }
func (b *batchBuf) key(i int) []byte    { return b.kb[i*b.keySize : (i+1)*b.keySize] }
func (b *batchBuf) value(i int) []byte  { return b.vb[i*b.valueSize : (i+1)*b.valueSize] }
