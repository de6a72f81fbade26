//go:build linux

package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ensureBPFFS makes dir a directory on a bpffs. A dir that is not on one gets a bpffs
// mounted on it, and lbd mounts nothing anywhere else: a host whose /sys/fs/bpf is not
// a bpffs (no systemd, or a daemon started with `ip netns exec`, which remounts /sys)
// gets a clear error for the default directory, never a machine-wide mount behind the
// operator's back. Pins in a bpffs mounted on dir live as long as its mount namespace.
func ensureBPFFS(dir string) error {
	underSys := false
	if rel, err := filepath.Rel(sysBPF, dir); err == nil && !strings.HasPrefix(rel, "..") {
		underSys = true
	}
	if underSys && !isBPFFS(sysBPF) {
		return fmt.Errorf("bpffs directory %s: %s is not a bpffs; mount one there (mount -t bpf bpf %s, as systemd does at boot) "+
			"or set datapath.bpffs_dir (--bpffs-dir) to a directory of lbd's own, where lbd mounts a bpffs itself", dir, sysBPF, sysBPF)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create bpffs directory: %w", err)
	}
	if isBPFFS(dir) {
		return nil
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs on %s: %w", dir, err)
	}
	return nil
}

const sysBPF = "/sys/fs/bpf"

func isBPFFS(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.BPF_FS_MAGIC
}

// migration is a pinned map that no longer fits its spec (size or layout changed): the
// old pin is moved aside before the programs load, so they create the new map, and its
// entries are copied into the new map afterwards.
type migration struct {
	name, oldPath, newPath string
	// copyable is false when the layout changed: the old map is dropped, which is only
	// allowed for maps the daemon fills from desired state (Sync rewrites them).
	copyable bool
}

// planMigrations checks every pinned map of spec in dir and moves aside those that must
// be rebuilt. Maps in learned hold state only the datapath knows (conntrack, NAT): a
// layout change there is an error, reported before anything is moved.
func planMigrations(dir string, spec *ebpf.CollectionSpec, learned map[string]bool) ([]*migration, error) {
	var out []*migration
	for name, ms := range spec.Maps {
		if ms.Pinning != ebpf.PinByName {
			continue
		}
		path := filepath.Join(dir, name)
		m, err := ebpf.LoadPinnedMap(path, nil)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("open pinned map %s: %w", name, err)
		}
		incompatible := ms.Compatible(m)
		copyable := m.Type() == ms.Type && m.KeySize() == ms.KeySize && m.ValueSize() == ms.ValueSize
		m.Close()
		if incompatible == nil {
			continue
		}
		if !copyable && learned[name] {
			return nil, fmt.Errorf("pinned map %s changed layout (%v): its entries cannot be carried over; "+
				"run the previous lbd, or `lbd --detach` to start empty (established flows are lost)", name, incompatible)
		}
		out = append(out, &migration{name: name, oldPath: path + "_migrating", newPath: path, copyable: copyable})
	}
	for _, mg := range out {
		if err := os.Rename(mg.newPath, mg.oldPath); err != nil {
			return nil, fmt.Errorf("move pinned map %s aside: %w", mg.name, err)
		}
	}
	return out, nil
}

// finish copies every entry of the old map into the new one and removes the old pin.
// Entries that do not fit a smaller map are counted as lost.
func (mg *migration) finish() (copied, lost int, err error) {
	if !mg.copyable {
		return 0, 0, os.Remove(mg.oldPath)
	}
	oldM, err := ebpf.LoadPinnedMap(mg.oldPath, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("open old map %s: %w", mg.name, err)
	}
	defer oldM.Close()
	newM, err := ebpf.LoadPinnedMap(mg.newPath, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("open new map %s: %w", mg.name, err)
	}
	defer newM.Close()
	switch oldM.Type() {
	case ebpf.PerCPUArray, ebpf.PerCPUHash, ebpf.LRUCPUHash:
		// Per-CPU counters are not worth a layout-aware copy: they restart from zero.
		return 0, 0, os.Remove(mg.oldPath)
	}
	inner := oldM.Type() == ebpf.ArrayOfMaps || oldM.Type() == ebpf.HashOfMaps
	key := make([]byte, oldM.KeySize())
	val := make([]byte, oldM.ValueSize())
	it := oldM.Iterate()
	for it.Next(&key, &val) {
		if err := copyEntry(newM, key, val, inner); err != nil {
			lost++
			continue
		}
		copied++
	}
	if err := it.Err(); err != nil {
		return copied, lost, fmt.Errorf("read old map %s: %w", mg.name, err)
	}
	if err := os.Remove(mg.oldPath); err != nil {
		return copied, lost, fmt.Errorf("remove old map %s: %w", mg.name, err)
	}
	return copied, lost, nil
}

// copyEntry writes one entry unless the new programs already wrote a newer one.
func copyEntry(m *ebpf.Map, key, val []byte, inner bool) error {
	var v any = val
	if inner {
		// Map-in-map values read back as IDs but are written as file descriptors.
		im, err := ebpf.NewMapFromID(ebpf.MapID(binary.NativeEndian.Uint32(val)))
		if err != nil {
			return err
		}
		defer im.Close()
		v = im
	}
	err := m.Update(key, v, ebpf.UpdateNoExist)
	if errors.Is(err, ebpf.ErrKeyExist) {
		return nil
	}
	return err
}
