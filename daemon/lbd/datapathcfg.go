package lbd

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/lbd-dev/lbd/daemon/config"
	"github.com/lbd-dev/lbd/daemon/datapath"
	"github.com/lbd-dev/lbd/daemon/gc"
	"github.com/lbd-dev/lbd/daemon/store"
)

// The datapath's configuration and memory budget, from lbd's configuration.

// datapathConfig turns the configuration into the datapath manager's.
func datapathConfig(cfg config.Config) (datapath.Config, error) {
	d := cfg.Datapath
	// The store's limits size the maps that IDs index: it hands out service IDs
	// 1..MaxServices and backend IDs 1..MaxBackends (0 is no ID), so each such map has
	// one entry more than its limit. The programs' compiled-in sizes
	// (lbxdp.DefaultMaxServices, ...) apply only where no size is given, and lbd always
	// gives one. TestMapsHoldStoreIDs checks the relation. It does not hold while the
	// IDs of removed services or backends wait for the datapath (store.Options.HoldIDs):
	// a new one then gets the next ID, which can be above its limit.
	dc := datapath.Config{
		LB:                 slices.Contains(cfg.Roles, config.RoleLB),
		Backend:            slices.Contains(cfg.Roles, config.RoleBackend),
		Interfaces:         d.Interfaces,
		BPFFSDir:           d.BPFFSDir,
		HashSeed:           d.HashSeed,
		VNI:                d.VNI,
		ConntrackSize:      d.ConntrackSize,
		ConntrackGuardRate: d.ConntrackGuardRate,
		NATSize:            d.NATSize,
		MaxServices:        uint32(cfg.Limits.MaxServices) + 1, // IDs 1..MaxServices
		MaxBackends:        uint32(cfg.Limits.MaxBackends) + 1, // IDs 1..MaxBackends
		GC:                 gc.Interval{Min: time.Duration(d.GCMinInterval), Max: time.Duration(d.GCMaxInterval), Start: time.Duration(d.GCMinInterval) * 10},
		TCPIdleTimeout:     time.Duration(d.TCPIdleTimeout),
		UDPIdleTimeout:     time.Duration(d.UDPIdleTimeout),
		NATClosingTimeout:  time.Duration(d.NATClosingTimeout),
		MonitorSample:      d.Monitor.Sample,
		MonitorRate:        d.Monitor.Rate,
		SocketLB:           d.SocketLB.Enabled,
		SocketCgroup:       d.SocketLB.Cgroup,
		SocketRevNATSize:   d.SocketLB.Translations,
	}
	dc.GC.Start = min(max(dc.GC.Start, dc.GC.Min), dc.GC.Max)
	dc.VerifyInterval = time.Duration(d.VerifyInterval)
	dc.NeighbourRecord = filepath.Join(cfg.StateDir, NeighbourRecordName)
	addrs, errs := d.Addrs()
	if len(errs) > 0 {
		return dc, errors.Join(errs...)
	}
	dc.Underlay4, dc.Underlay6, dc.LBSources = addrs.Underlay4, addrs.Underlay6, addrs.LBSources
	return dc, dc.GC.Validate()
}

// memoryBudget is what the services' Maglev tables may take: datapath.memory_budget
// (or a quarter of the machine's memory) less what the datapath's other maps take.
func memoryBudget(cfg config.Config, mgr *datapath.Manager) (store.MemoryBudget, error) {
	total := uint64(cfg.Datapath.MemoryBudget)
	if total == 0 {
		var err error
		if total, err = datapath.DefaultMemoryBudget(); err != nil {
			return store.MemoryBudget{}, err
		}
	}
	maps, err := mgr.MapBytes()
	if err != nil {
		return store.MemoryBudget{}, fmt.Errorf("measure the datapath's maps: %w", err)
	}
	if maps > total {
		return store.MemoryBudget{}, fmt.Errorf("datapath.memory_budget: the maps the configuration sizes take %d bytes, more than the budget of %d: "+
			"raise the budget or lower conntrack_size, nat_size, limits.max_services or limits.max_backends", maps, total)
	}
	return store.MemoryBudget{Tables: total - maps, Total: total, Setting: "datapath.memory_budget", TableBytes: mgr.TableBytes}, nil
}
