//go:build linux

package xdpgen

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/lbd-dev/lbd/internal/testnet"
)

// Pacer joins an injector to the counters where its frames arrive: with a Window,
// the injector keeps at most that many frames sent and not counted yet, so that every
// frame is delivered however slow the path, in one BPF_PROG_RUN call (each call costs
// tens of milliseconds or more of setup and teardown, too much to pace by calls).
type Pacer struct {
	arrived *ebpf.Map
}

// NewPacer creates a pacer: a count of arrivals that its counters add to.
func NewPacer() (*Pacer, error) {
	spec, err := loadXdpgen()
	if err != nil {
		return nil, err
	}
	m, err := ebpf.NewMap(spec.Maps["xg_arrived"])
	if err != nil {
		return nil, fmt.Errorf("xdpgen: create pacer: %w", err)
	}
	return &Pacer{arrived: m}, nil
}

// Count attaches a Counter whose arrivals the pacer sees (see Count).
func (p *Pacer) Count(ns *testnet.NS, ifname string, drop bool) (*Counter, error) {
	return count(ns, ifname, drop, p)
}

// Arrived returns the frames the pacer's counters have counted.
func (p *Pacer) Arrived() (uint64, error) {
	var n uint64
	if err := p.arrived.Lookup(uint32(0), &n); err != nil {
		return 0, fmt.Errorf("xdpgen: read pacer: %w", err)
	}
	return n, nil
}

// Close releases the pacer's map (counters and injectors using it keep their
// reference).
func (p *Pacer) Close() error { return p.arrived.Close() }

// replacements gives a program the pacer's map; nil keeps the program's own.
func (p *Pacer) replacements() *ebpf.CollectionOptions {
	if p == nil {
		return nil
	}
	return &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{"xg_arrived": p.arrived}}
}
