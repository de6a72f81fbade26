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

// ensureBPFFS makes dir a directory on a bpffs, mounting one there if needed. A daemon
// started with `ip netns exec` sees an empty /sys/fs/bpf on sysfs (TESTBED.md): mounting
// a bpffs on the instance directory keeps pins working there too, though such a mount
// lives only as long as that mount namespace.
func ensureBPFFS(dir string) (mounted bool, err error) {
	// A host without a bpffs on /sys/fs/bpf (sysfs refuses mkdir there) gets one, as
	// systemd would mount it.
	if rel, err := filepath.Rel(sysBPF, dir); err == nil && !strings.HasPrefix(rel, "..") && !isBPFFS(sysBPF) {
		if err := unix.Mount("bpf", sysBPF, "bpf", 0, "mode=0700"); err != nil {
			return false, fmt.Errorf("mount bpffs on %s: %w", sysBPF, err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, fmt.Errorf("create bpffs directory: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, fmt.Errorf("statfs %s: %w", dir, err)
	}
	if st.Type == unix.BPF_FS_MAGIC {
		return false, nil
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return false, fmt.Errorf("mount bpffs on %s: %w", dir, err)
	}
	return true, nil
}

const sysBPF = "/sys/fs/bpf"

func isBPFFS(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.BPF_FS_MAGIC
}

// migration is a pinned map that must be rebuilt because its size changed: the old pin
// is moved aside before the programs load (so they create the new map) and its entries
// are copied into the new map afterwards.
type migration struct {
	name, oldPath, newPath string
}

// prepareMigration moves the pin of map name aside if its max_entries differs from want.
// Key and value sizes must match: a layout change cannot be copied byte for byte.
func prepareMigration(dir, name string, want uint32) (*migration, error) {
	path := filepath.Join(dir, name)
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open pinned map %s: %w", name, err)
	}
	defer m.Close()
	if m.MaxEntries() == want {
		return nil, nil
	}
	old := path + ".migrating"
	if err := os.Rename(path, old); err != nil {
		return nil, fmt.Errorf("move pinned map %s aside: %w", name, err)
	}
	return &migration{name: name, oldPath: old, newPath: path}, nil
}

// finish copies every entry of the old map into the new one and removes the old pin.
// Entries that do not fit a smaller map are counted as lost.
func (mg *migration) finish() (copied, lost int, err error) {
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
	if oldM.KeySize() != newM.KeySize() || oldM.ValueSize() != newM.ValueSize() {
		return 0, 0, fmt.Errorf("migrate map %s: layout changed (key %d→%d, value %d→%d bytes); old map kept at %s",
			mg.name, oldM.KeySize(), newM.KeySize(), oldM.ValueSize(), newM.ValueSize(), mg.oldPath)
	}
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
		var v any = val
		if inner {
			// Map-in-map values read back as IDs but are written as file descriptors.
			m, err := ebpf.NewMapFromID(ebpf.MapID(binary.NativeEndian.Uint32(val)))
			if err != nil {
				lost++
				continue
			}
			defer m.Close()
			v = m
		}
		// UpdateNoExist: an entry the new programs already wrote is newer than the copy.
		err := newM.Update(key, v, ebpf.UpdateNoExist)
		switch {
		case err == nil:
			copied++
		case errors.Is(err, ebpf.ErrKeyExist):
		default:
			lost++
		}
	}
	if err := it.Err(); err != nil {
		return copied, lost, fmt.Errorf("read old map %s: %w", mg.name, err)
	}
	if err := os.Remove(mg.oldPath); err != nil {
		return copied, lost, fmt.Errorf("remove old map %s: %w", mg.name, err)
	}
	return copied, lost, nil
}
