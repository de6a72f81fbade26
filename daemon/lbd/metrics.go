package lbd

import (
	"fmt"
	"slices"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/config"
	"github.com/lbd-dev/lbd/daemon/metrics"
	"github.com/lbd-dev/lbd/daemon/servicematch"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// newMetrics builds the node's metrics: the datapath's counters (dp is nil on a node
// without a datapath; there are none until it is open), the services' status from the
// store, readiness, the drain flag and the build, with per-service and per-backend series
// for what cfg.Metrics chooses.
func newMetrics(cfg config.Config, dp *openingDatapath, st *store.Store, ready metrics.ReadyFunc, log hclog.Logger) (*metrics.Metrics, error) {
	listed, err := servicematch.Compile(cfg.Metrics.BackendSeriesServices)
	if err != nil {
		return nil, fmt.Errorf("metrics.backend_series_services%w", err)
	}
	selected, err := servicematch.Compile(cfg.Metrics.ServiceSeriesServices)
	if err != nil {
		return nil, fmt.Errorf("metrics.service_series_services%w", err)
	}
	opts := metrics.Options{
		LB:       slices.Contains(cfg.Roles, config.RoleLB),
		Backends: metrics.BackendSeries{All: cfg.Metrics.BackendSeries, Services: listed},
		Services: metrics.ServiceSeries{Limit: cfg.Metrics.ServiceSeriesLimit, Services: selected},
		Log:      log,
	}
	var met *metrics.Metrics
	if dp != nil {
		stats := func(backendsOf func(service string) bool) (*lbdv1.GetStatsResponse, error) {
			if m := dp.m.Load(); m != nil {
				return m.Stats(backendsOf)
			}
			return &lbdv1.GetStatsResponse{}, nil // no counters yet
		}
		opts.Capacities = map[string]uint32{"conntrack": cfg.Datapath.ConntrackSize, "nat": cfg.Datapath.NATSize}
		met = metrics.New(stats, opts)
		met.AddDrift(dp.DriftCounts)
	} else {
		met = metrics.New(nil, opts)
	}
	met.AddStatus(st.StatusCounts)
	met.SetReady(ready)
	met.AddDrained(st.Drained)
	met.AddBuildInfo(Version, cfg.Roles)
	return met, nil
}
