//go:build linux

package testnet

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// BPFFS mounts a private bpffs in a directory of its own and returns the directory.
// Never /sys/fs/bpf: the host may have none there, and tests must not mount one behind
// the user's back (docs/testing.md). Pins in it go with it at cleanup.
func BPFFS(tb testing.TB) string {
	tb.Helper()
	Require(tb)
	dir := MountDir(tb)
	if err := os.Mkdir(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		tb.Fatalf("mount bpffs on %s: %v", dir, err)
	}
	return dir
}

// MountDir returns a path, not created yet, in a new temporary directory, for code
// under test that mounts a bpffs itself (lbd's datapath does). At cleanup the pins in
// it are removed, whatever is mounted there is detached, and the directory goes.
func MountDir(tb testing.TB) string {
	tb.Helper()
	parent, err := os.MkdirTemp("", "lbd-bpffs-")
	if err != nil {
		tb.Fatal(err)
	}
	dir := filepath.Join(parent, "bpf")
	tb.Cleanup(func() {
		// Unpinning first frees the maps and programs even if a process of another
		// mount namespace still holds the mount.
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			os.RemoveAll(filepath.Join(dir, e.Name()))
		}
		// EINVAL: nothing is mounted there; ENOENT: the directory was never created.
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			tb.Errorf("unmount %s: %v", dir, err)
		}
		if err := os.RemoveAll(parent); err != nil {
			tb.Errorf("remove %s: %v", parent, err)
		}
	})
	return dir
}
