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
		"lb_vips":       opts.MaxServices,
		"lb_services":   opts.MaxServices,
		"lb_svc_by_id":  opts.MaxServices,
		"lb_tables":     opts.MaxServices,
		"lb_svc_stats":  opts.MaxServices,
		"lb_backends":   opts.MaxBackends,
		"lb_be_stats":   opts.MaxBackends,
		"lb_fib_cache":  opts.MaxBackends,
		"lb_quic_sids":  opts.MaxBackends,
		"lb_ct4":        ConntrackEntries(opts.ConntrackSize),
		"lb_ct6":        ConntrackEntries(opts.ConntrackSize),
		"lb_affinity":   opts.AffinitySize,
		"lb_src_ranges": opts.SourceRangeSize,
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
