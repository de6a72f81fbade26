// Package lock takes the exclusive locks that make one lbd the only owner of a state
// file, a bpffs directory or an interface, and names the process that holds a lock
// when it cannot be taken. Locks are flock(2) locks: the kernel drops them when the
// holder exits, however it exits, so a crashed lbd never leaves a stale lock behind.
package lock

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrHeld is wrapped by Acquire's error when another process holds the lock.
var ErrHeld = errors.New("held by another process")

// Held is a lock this process holds until Release (or until it exits).
type Held struct {
	f *os.File
}

// Acquire locks path without waiting. path may be a directory (then it must exist)
// or a file (created if missing). what names the resource in errors ("bpffs
// directory /sys/fs/bpf/lbd"); the error for a held lock names the holder's PID.
func Acquire(path, what string) (*Held, error) {
	f, err := open(path)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", what, err)
	}
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		holder := holderOf(f)
		f.Close()
		return nil, fmt.Errorf("%s is in use by another lbd (%s): %w", what, holder, ErrHeld)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", what, err)
	}
	return &Held{f: f}, nil
}

func open(path string) (*os.File, error) {
	st, err := os.Stat(path)
	if err == nil && st.IsDir() {
		return os.Open(path)
	}
	return os.OpenFile(path, os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
}

// Release drops the lock.
func (h *Held) Release() error {
	if h == nil || h.f == nil {
		return nil
	}
	err := h.f.Close()
	h.f = nil
	return err
}

// holderOf finds the process holding a flock on f's inode in /proc/locks, whose
// lines read "1: FLOCK  ADVISORY  WRITE 4242 00:2f:123 0 EOF".
func holderOf(f *os.File) string {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return "holder unknown"
	}
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	locks, err := os.Open("/proc/locks")
	if err != nil {
		return "holder unknown"
	}
	defer locks.Close()
	sc := bufio.NewScanner(locks)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[1] != "FLOCK" || fields[5] != want {
			continue
		}
		if pid, err := strconv.Atoi(fields[4]); err == nil {
			return "PID " + strconv.Itoa(pid)
		}
	}
	return "holder unknown"
}
