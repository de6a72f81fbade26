//go:build linux

package datapath

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// attachSpec is how one link was made, so that a link found detached (by
// `bpftool link detach`, or with its interface deleted and created again) can be
// made again.
type attachSpec struct {
	prog      *ebpf.Program
	attachNew func() (link.Link, error)
}

// attach adopts the link pinned under name, pointing it at prog (an atomic replacement
// when the program changed), or attaches anew and pins the link. A pinned link that no
// longer holds an interface is replaced by a new one.
func (m *Manager) attach(name string, prog *ebpf.Program, attachNew func() (link.Link, error)) error {
	m.attaches[name] = attachSpec{prog: prog, attachNew: attachNew}
	path := filepath.Join(m.cfg.linksDir(), name)
	l, err := link.LoadPinnedLink(path, nil)
	if err == nil {
		if on, ierr := linkAttached(l); ierr == nil && !on {
			m.log.Warn("pinned link was detached from its interface; attaching again", "op", "attach", "link", name)
			err = errors.Join(l.Unpin(), l.Close(), fs.ErrNotExist)
		}
	}
	switch {
	case err == nil:
		if err := l.Update(prog); err != nil {
			l.Close()
			return fmt.Errorf("replace program of pinned link %s: %w", name, err)
		}
		m.log.Info("adopted pinned link", "op", "attach", "link", name)
	case errors.Is(err, fs.ErrNotExist):
		if l, err = attachNew(); err != nil {
			return err
		}
		if err := l.Pin(path); err != nil {
			l.Close()
			return fmt.Errorf("pin link %s: %w", name, err)
		}
		m.log.Info("attached", "op", "attach", "link", name)
	default:
		return fmt.Errorf("open pinned link %s: %w", name, err)
	}
	m.links[name] = l
	return nil
}

// linkAttached reports whether an XDP or tcx link still holds its interface: a link
// detached from outside, or whose interface went away, reports ifindex 0.
func linkAttached(l link.Link) (bool, error) {
	info, err := l.Info()
	if err != nil {
		return false, fmt.Errorf("read link info: %w", err)
	}
	switch {
	case info.XDP() != nil:
		return info.XDP().Ifindex != 0, nil
	case info.TCX() != nil:
		return info.TCX().Ifindex != 0, nil
	}
	return true, nil
}

// detachedLinks names the links that no longer hold their interface. Caller holds mu.
func (m *Manager) detachedLinks() ([]string, error) {
	var out []string
	for name, l := range m.links {
		on, err := linkAttached(l)
		if err != nil {
			return nil, fmt.Errorf("link %s: %w", name, err)
		}
		if !on {
			out = append(out, name)
		}
	}
	return out, nil
}

// reattach makes a detached link again. Caller holds mu.
func (m *Manager) reattach(name string) error {
	spec, ok := m.attaches[name]
	if !ok {
		return fmt.Errorf("reattach %s: no attachment of that name", name)
	}
	if old := m.links[name]; old != nil {
		if err := old.Unpin(); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("reattach %s: unpin the detached link: %w", name, err)
		}
		old.Close()
		delete(m.links, name)
	}
	return m.attach(name, spec.prog, spec.attachNew)
}

// Attached reports whether every program is attached to its interface: false after
// Detach, and false while a link is found detached from outside (RunVerify attaches it
// again).
func (m *Manager) Attached() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	on, _ := m.attachment()
	return on
}

// Ready reports whether the node forwards what it is asked to, and why not: the
// programs are attached to every interface, and the maps hold the desired state (the
// first Sync is done on LB nodes).
func (m *Manager) Ready() (bool, string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if on, why := m.attachment(); !on {
		return false, why
	}
	if m.lb != nil && !m.synced {
		return false, "the maps are being brought in line with the desired state"
	}
	return true, "datapath attached and in line with the desired state"
}

// Synced is closed once the first Sync has brought the LB maps in line with the desired
// state: what readiness waits for once the programs are attached. A node without LB
// maps has nothing to sync, and it is never closed.
func (m *Manager) Synced() <-chan struct{} { return m.syncedCh }

// attachment reports whether every program is attached, and why not. Caller holds mu.
func (m *Manager) attachment() (bool, string) {
	if !m.attached {
		return false, "the datapath is detached (lbctl node detach); restart lbd to attach it again"
	}
	gone, err := m.detachedLinks()
	if err != nil {
		return false, "cannot read the datapath's links: " + err.Error()
	}
	if len(gone) > 0 {
		return false, fmt.Sprintf("program not attached: %v (removed from outside); lbd attaches it again within %s",
			gone, m.verifyInterval())
	}
	return true, ""
}
