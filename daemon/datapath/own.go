//go:build linux

package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/lbd-dev/lbd/daemon/lock"
	"golang.org/x/sys/unix"
)

// interfaceLockDir holds one lock file per (network namespace, interface) that an
// lbd attaches to: two daemons must never program the same interface, even with
// different bpffs directories.
const interfaceLockDir = "/run/lbd/locks"

// own takes the bpffs directory and every interface for this daemon alone. A second
// lbd fails here, naming the PID of the first, before it touches a pin or a program.
func (m *Manager) own(ifaces []string) error {
	l, err := lock.Acquire(m.cfg.BPFFSDir, "bpffs directory "+m.cfg.BPFFSDir)
	if err != nil {
		return err
	}
	m.locks = append(m.locks, l)
	if len(ifaces) == 0 {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return fmt.Errorf("identify network namespace: %w", err)
	}
	if err := os.MkdirAll(interfaceLockDir, 0o700); err != nil {
		return fmt.Errorf("create interface lock directory: %w", err)
	}
	for _, name := range ifaces {
		path := filepath.Join(interfaceLockDir, fmt.Sprintf("netns-%d-%s.lock", st.Ino, name))
		l, err := lock.Acquire(path, "interface "+name)
		if err != nil {
			return err
		}
		m.locks = append(m.locks, l)
	}
	return nil
}

// disown releases the locks (Close).
func (m *Manager) disown() error {
	var errs []error
	for _, l := range m.locks {
		errs = append(errs, l.Release())
	}
	m.locks = nil
	return errors.Join(errs...)
}
