//go:build linux

package lbxdp

import (
	"fmt"

	"github.com/cilium/ebpf"
)

// Spec returns the collection Load would load for opts, map sizes applied. The daemon
// compares its maps with pinned ones to migrate a map whose size or layout changed.
func Spec(opts Options) (*ebpf.CollectionSpec, error) {
	opts.setDefaults()
	spec, err := loadLbxdp()
	if err != nil {
		return nil, fmt.Errorf("load lbxdp spec: %w", err)
	}
	sizes := map[string]uint32{
		lbxdpMapLbVips:      opts.MaxServices,
		lbxdpMapLbServices:  opts.MaxServices,
		lbxdpMapLbSvcById:   opts.MaxServices,
		lbxdpMapLbTables:    opts.MaxServices,
		lbxdpMapLbSvcStats:  opts.MaxServices,
		lbxdpMapLbBackends:  opts.MaxBackends,
		lbxdpMapLbBeStats:   opts.MaxBackends,
		lbxdpMapLbFibCache:  opts.MaxBackends,
		lbxdpMapLbQuicSids:  opts.MaxBackends,
		lbxdpMapLbCt4:       ConntrackEntries(opts.ConntrackSize),
		lbxdpMapLbCt6:       ConntrackEntries(opts.ConntrackSize),
		lbxdpMapLbAffinity:  opts.AffinitySize,
		lbxdpMapLbSrcRanges: opts.SourceRangeSize,
	}
	for name, m := range spec.Maps {
		if n, ok := sizes[name]; ok {
			m.MaxEntries = n
		}
		if opts.PinPath == "" {
			m.Pinning = ebpf.PinNone
		}
	}
	return spec, nil
}

// ConntrackEntries is the size of the conntrack map for a capacity of flows: a
// quarter more, so that new flows find free entries while the collector has not
// yet reclaimed the excess (see SweepConntrack).
func ConntrackEntries(capacity uint32) uint32 {
	return uint32(min(uint64(capacity)+uint64(capacity)/4, 1<<32-1))
}

// Names of the maps that other packages find by name (a migration's plan, a pin that
// a test opens), as bpf2go generates them from the program: a map renamed in C no
// longer builds here rather than being missed at run time.
const (
	MapServices     = lbxdpMapLbServices
	MapBackends     = lbxdpMapLbBackends
	MapTables       = lbxdpMapLbTables
	MapConntrack4   = lbxdpMapLbCt4
	MapConntrack6   = lbxdpMapLbCt6
	MapAffinity     = lbxdpMapLbAffinity
	MapServiceStats = lbxdpMapLbSvcStats
	MapBackendStats = lbxdpMapLbBeStats
	MapDropStats    = lbxdpMapLbDropStats
)
