package lbd

import (
	"context"
	"sync/atomic"

	"github.com/lbd-dev/lbd/daemon/datapath"
	"github.com/lbd-dev/lbd/daemon/model"
	"github.com/lbd-dev/lbd/daemon/monitor"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// openingReason says why the datapath cannot answer yet.
const openingReason = "the datapath is being opened (the programs and maps pinned under bpffs_dir adopted, or loaded)"

// openingDatapath is the node's datapath as the API, metrics and readiness see it while
// lbd starts. The API serves the desired state from the first moment; what needs the
// datapath answers UNAVAILABLE until the manager is open, then goes to it.
type openingDatapath struct {
	m atomic.Pointer[datapath.Manager]
}

func (d *openingDatapath) set(m *datapath.Manager) { d.m.Store(m) }

func (d *openingDatapath) manager() (*datapath.Manager, error) {
	if m := d.m.Load(); m != nil {
		return m, nil
	}
	return nil, status.Error(codes.Unavailable, openingReason+"; try again in a moment")
}

// TraceFlow implements api.Datapath.
func (d *openingDatapath) TraceFlow(ctx context.Context, f model.Flow) (*lbdv1.TraceFlowResponse, error) {
	m, err := d.manager()
	if err != nil {
		return nil, err
	}
	return m.TraceFlow(ctx, f)
}

// ListConnections implements api.Datapath.
func (d *openingDatapath) ListConnections(ctx context.Context, r *lbdv1.ListConnectionsRequest) (*lbdv1.ListConnectionsResponse, error) {
	m, err := d.manager()
	if err != nil {
		return nil, err
	}
	return m.ListConnections(ctx, r)
}

// GetStats implements api.Datapath.
func (d *openingDatapath) GetStats(ctx context.Context, r *lbdv1.GetStatsRequest) (*lbdv1.GetStatsResponse, error) {
	m, err := d.manager()
	if err != nil {
		return nil, err
	}
	return m.GetStats(ctx, r)
}

// ListSocketTranslations implements api.Datapath.
func (d *openingDatapath) ListSocketTranslations(ctx context.Context, r *lbdv1.ListSocketTranslationsRequest) (*lbdv1.ListSocketTranslationsResponse, error) {
	m, err := d.manager()
	if err != nil {
		return nil, err
	}
	return m.ListSocketTranslations(ctx, r)
}

// Detach implements api.Datapath.
func (d *openingDatapath) Detach(ctx context.Context) error {
	m, err := d.manager()
	if err != nil {
		return err
	}
	return m.Detach(ctx)
}

// Attached implements api.Datapath.
func (d *openingDatapath) Attached() bool {
	m := d.m.Load()
	return m != nil && m.Attached()
}

// Ready implements api.Datapath.
func (d *openingDatapath) Ready() (bool, string) {
	m := d.m.Load()
	if m == nil {
		return false, openingReason
	}
	return m.Ready()
}

// NextHops implements api.Datapath.
func (d *openingDatapath) NextHops() []*lbdv1.NextHop {
	if m := d.m.Load(); m != nil {
		return m.NextHops()
	}
	return nil
}

// Verify implements api.Datapath.
func (d *openingDatapath) Verify(ctx context.Context) ([]*lbdv1.Drift, error) {
	m, err := d.manager()
	if err != nil {
		return nil, err
	}
	return m.Verify(ctx)
}

// DriftCounts implements api.Datapath.
func (d *openingDatapath) DriftCounts() map[string]uint64 {
	if m := d.m.Load(); m != nil {
		return m.DriftCounts()
	}
	return nil
}

// SetMonitor implements monitor.Source.
func (d *openingDatapath) SetMonitor(on, forwarded bool) error {
	m, err := d.manager()
	if err != nil {
		return err
	}
	return m.SetMonitor(on, forwarded)
}

// OpenMonitor implements monitor.Source.
func (d *openingDatapath) OpenMonitor() (monitor.Reader, error) {
	m, err := d.manager()
	if err != nil {
		return nil, err
	}
	return m.OpenMonitor()
}
