//go:build linux

package datapath

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	"github.com/lbd-dev/lbd/bpf/lbxdp"
)

// A node that ran an lbd from before conntrack was split by family still has the
// former conntrack map pinned (lbxdp.LegacyConntrackName), written by the old XDP
// program until the new one replaces it. Its flows are carried over like a migrated
// map's (migrate.go), converted to the new layout: a first copy right after the new
// maps are created, a second after every program is switched (what the old program
// wrote meanwhile, where the new one has no newer entry), then the pin is removed.

// legacyConntrack is the former conntrack map being carried over.
type legacyConntrack struct {
	m    *ebpf.Map
	path string
}

// ctPinned reports whether the LB directory holds the current conntrack maps already
// (a start after a first copy that did not get to the second).
func (c Config) ctPinned() bool {
	_, err := os.Stat(filepath.Join(c.lbDir(), lbxdp.MapConntrack4))
	return err == nil
}

// adoptLegacyConntrack makes the first copy, if the former map is pinned. replace:
// the current maps are new, nothing in them is newer than the former map's entries.
func (m *Manager) adoptLegacyConntrack(replace bool) error {
	path := filepath.Join(m.cfg.lbDir(), lbxdp.LegacyConntrackName)
	old, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open former conntrack %s: %w", path, err)
	}
	if !lbxdp.IsLegacyConntrack(old) {
		old.Close()
		return fmt.Errorf("pinned map %s is not lbd's former conntrack (%v, key %d, value %d bytes): remove it", path, old.Type(), old.KeySize(), old.ValueSize())
	}
	start := time.Now()
	w, present, err := m.lb.AdoptLegacyConntrack(old, lbxdp.MonotonicNow(), replace)
	if err != nil {
		old.Close()
		return err
	}
	m.log.Info("former conntrack copied, old program still attached", "op", "migrate", "map", lbxdp.LegacyConntrackName,
		"copied", w, "present", present, "took", time.Since(start))
	m.legacyCT = &legacyConntrack{m: old, path: path}
	return nil
}

// finishLegacyConntrack makes the second copy and removes the former map's pin.
func (m *Manager) finishLegacyConntrack() error {
	l := m.legacyCT
	if l == nil {
		return nil
	}
	defer l.m.Close()
	start := time.Now()
	w, present, err := m.lb.AdoptLegacyConntrack(l.m, lbxdp.MonotonicNow(), false)
	if err != nil {
		return err
	}
	if err := l.m.Unpin(); err != nil {
		return fmt.Errorf("remove former conntrack %s: %w", l.path, err)
	}
	m.legacyCT = nil
	m.log.Info("former conntrack migrated", "op", "migrate", "map", lbxdp.LegacyConntrackName,
		"copied_after_switch", w, "present", present, "took", time.Since(start))
	return nil
}

// removeLegacyTables removes the former Maglev map's pin (lbxdp.LegacyTablesName), once
// no program of this lbd can use it: the old programs that read it go with their last
// reference, and its tables (up to 1 MiB of locked memory each) with them.
func (m *Manager) removeLegacyTables() error {
	path := filepath.Join(m.cfg.lbDir(), lbxdp.LegacyTablesName)
	old, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open former maglev tables %s: %w", path, err)
	}
	defer old.Close()
	if old.Type() != ebpf.ArrayOfMaps {
		return fmt.Errorf("pinned map %s is not lbd's former maglev tables (%v): remove it", path, old.Type())
	}
	if err := old.Unpin(); err != nil {
		return fmt.Errorf("remove former maglev tables %s: %w", path, err)
	}
	m.log.Info("former maglev tables removed", "op", "migrate", "map", lbxdp.LegacyTablesName)
	return nil
}
