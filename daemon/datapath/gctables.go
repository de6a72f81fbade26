//go:build linux

package datapath

import (
	"context"
	"time"

	"github.com/lbd-dev/lbd/bpf/backendtc"
	"github.com/lbd-dev/lbd/bpf/lbxdp"
	"github.com/lbd-dev/lbd/daemon/gc"
)

// conntrackTable adapts the LB conntrack map to the collector.
type conntrackTable struct{ lb *lbxdp.Datapath }

func (conntrackTable) Name() string { return "conntrack" }

func (t conntrackTable) Sweep(now time.Duration) (gc.Sweep, error) {
	r, err := t.lb.SweepConntrack(now)
	return gc.Sweep{Scanned: r.Scanned, Deleted: r.Deleted, Fill: r.Fill}, err
}

// natTable adapts the backend NAT map to the collector.
type natTable struct {
	be                        *backendtc.Datapath
	tcpIdle, udpIdle, closing time.Duration
	size                      uint32
}

func (m *Manager) natTable() natTable {
	return natTable{m.be, NATIdle(m.cfg.tcpIdle()), NATIdle(m.cfg.udpIdle()), m.cfg.NATClosingTimeout, m.cfg.NATSize}
}

func (natTable) Name() string { return "nat" }

// expired reports whether the sweep removes e.
func (t natTable) expired(e backendtc.NATEntry) bool {
	idle := t.tcpIdle
	if e.Proto == backendtc.ProtoUDP {
		idle = t.udpIdle
	}
	return e.Expired(idle, t.closing)
}

func (t natTable) Sweep(time.Duration) (gc.Sweep, error) {
	entries, err := t.be.NATEntries()
	if err != nil {
		return gc.Sweep{}, err
	}
	var expired []backendtc.NATKey
	for _, e := range entries {
		if t.expired(e) {
			expired = append(expired, e.NATKey)
		}
	}
	deleted, err := t.be.DeleteNAT(expired)
	sw := gc.Sweep{Scanned: len(entries), Deleted: deleted}
	if t.size > 0 {
		sw.Fill = float64(len(entries)-deleted) / float64(t.size)
	}
	return sw, err
}

// RunGC collects expired conntrack and NAT entries until ctx ends.
func (m *Manager) RunGC(ctx context.Context, observe func(gc.Pass)) {
	done := make(chan struct{}, 2)
	n := 0
	if m.lb != nil {
		n++
		go func() {
			gc.Run(ctx, conntrackTable{m.lb}, m.cfg.GC, lbxdp.MonotonicNow, observe, m.log.Named("gc"))
			done <- struct{}{}
		}()
	}
	if m.be != nil {
		n++
		go func() {
			gc.Run(ctx, m.natTable(), m.cfg.GC, lbxdp.MonotonicNow, observe, m.log.Named("gc"))
			done <- struct{}{}
		}()
	}
	for range n {
		<-done
	}
}

// SweepNow runs one collection pass over every table (tests and benchmarks).
func (m *Manager) SweepNow() ([]gc.Pass, error) {
	var out []gc.Pass
	var tables []gc.Table
	if m.lb != nil {
		tables = append(tables, conntrackTable{m.lb})
	}
	if m.be != nil {
		tables = append(tables, m.natTable())
	}
	for _, t := range tables {
		start := time.Now()
		sw, err := t.Sweep(lbxdp.MonotonicNow())
		if err != nil {
			return out, err
		}
		out = append(out, gc.Pass{Table: t.Name(), Sweep: sw, Duration: time.Since(start)})
	}
	return out, nil
}
