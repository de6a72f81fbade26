//go:build linux

package datapath

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

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
