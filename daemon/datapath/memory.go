//go:build linux

package datapath

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/lbd-dev/lbd/daemon/maglev"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// TableBytes is the kernel memory (memlock) the Maglev table of svc takes: its size
// follows the service's backends unless it sets one (maglev.TableSize), and its map
// has 64-byte elements for the head, the backend indexes of every backend of the
// service, and two halves of 2-byte slots (bpf/lbxdp/tables.go), plus the kernel's
// own part of the map. 0 on a node without the LB maps.
func (m *Manager) TableBytes(svc *lbdv1.Service) uint64 {
	if m.lb == nil {
		return 0
	}
	var entries uint64
	for _, b := range svc.Backends {
		entries += uint64(b.Weight)
	}
	size := maglev.TableSize(svc.MaglevTableSize, len(svc.Backends), entries)
	return m.lb.TableMemlock(size, len(svc.Backends))
}

// MapBytes is the kernel memory (memlock) of every map the loaded programs use, the
// Maglev tables held in lb_tables aside: the part of the node's BPF memory that the
// configuration sizes, whatever the services.
func (m *Manager) MapBytes() (uint64, error) {
	var progs []*ebpf.Program
	if m.lb != nil {
		progs = append(progs, m.lb.Program())
	}
	if m.be != nil {
		progs = append(progs, m.be.IngressProgram(), m.be.EgressProgram())
	}
	if m.sock != nil {
		for _, h := range m.sock.Hooks() {
			progs = append(progs, h.Program)
		}
	}
	seen := map[ebpf.MapID]bool{}
	var total uint64
	for _, p := range progs {
		info, err := p.Info()
		if err != nil {
			return 0, fmt.Errorf("read program info: %w", err)
		}
		ids, ok := info.MapIDs()
		if !ok {
			return 0, errors.New("read program info: the kernel does not list a program's maps")
		}
		for _, id := range ids {
			if seen[id] {
				continue
			}
			seen[id] = true
			n, err := mapMemlock(id)
			if err != nil {
				return 0, err
			}
			total += n
		}
	}
	return total, nil
}

func mapMemlock(id ebpf.MapID) (uint64, error) {
	mp, err := ebpf.NewMapFromID(id)
	if err != nil {
		return 0, fmt.Errorf("open map %d: %w", id, err)
	}
	defer mp.Close()
	info, err := mp.Info()
	if err != nil {
		return 0, fmt.Errorf("read map %d info: %w", id, err)
	}
	// Maps that allocate per entry (an empty LPM trie, socket storage) report none.
	n, _ := info.Memlock()
	return n, nil
}

// DefaultMemoryBudget is a quarter of the machine's memory (MemTotal), what lbd's maps
// may take when the configuration sets no budget.
func DefaultMemoryBudget() (uint64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("read memory size: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("read memory size: %q: %w", line, err)
			}
			return kb * 1024 / 4, nil
		}
	}
	return 0, errors.New("read memory size: no MemTotal in /proc/meminfo")
}
