package lbd

import (
	"fmt"

	"github.com/lbd-dev/lbd/daemon/config"
	"github.com/lbd-dev/lbd/daemon/metrics"
	"github.com/lbd-dev/lbd/daemon/servicematch"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// newMetrics builds the node's metrics: the datapath's counters (dp is nil on a node
// without a datapath; there are none until it is open), the services' status from the
// store, readiness, the drain flag and the build, with per-backend series only for what
// cfg.Metrics chooses.
func newMetrics(cfg config.Config, dp *openingDatapath, st *store.Store, ready metrics.ReadyFunc) (*metrics.Metrics, error) {
	listed, err := servicematch.Compile(cfg.Metrics.BackendSeriesServices)
	if err != nil {
		return nil, fmt.Errorf("metrics.backend_series_services%w", err)
	}
	backends := metrics.BackendSeries{All: cfg.Metrics.BackendSeries, Services: listed}
	var met *metrics.Metrics
	if dp != nil {
		stats := func(backendsOf func(service string) bool) (*lbdv1.GetStatsResponse, error) {
			if m := dp.m.Load(); m != nil {
				return m.Stats(backendsOf)
			}
			return &lbdv1.GetStatsResponse{}, nil // no counters yet
		}
		met = metrics.New(stats, map[string]uint32{"conntrack": cfg.Datapath.ConntrackSize, "nat": cfg.Datapath.NATSize}, backends)
		met.AddDrift(dp.DriftCounts)
	} else {
		met = metrics.New(nil, nil, backends)
	}
	met.AddStatus(st.StatusCounts)
	met.SetReady(ready)
	met.AddDrained(st.Drained)
	met.AddBuildInfo(Version, cfg.Roles)
	return met, nil
}
