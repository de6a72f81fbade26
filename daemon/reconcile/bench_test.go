package reconcile

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// The control plane's share of a change: the store (persisted), the reconciler and the
// status reports, with the in-memory Fake as the datapath, so that the figures hold no
// map writes.

func benchServices(n int) []*lbdv1.Service {
	out := make([]*lbdv1.Service, n)
	for i := range n {
		s := &lbdv1.Service{Name: fmt.Sprintf("ns-%d/svc-%05d", i/100, i), Vip: fmt.Sprintf("203.0.113.%d", i%250+1),
			Port: uint32(1000 + i/250), Protocol: lbdv1.Protocol_PROTOCOL_TCP}
		for j := range 10 {
			s.Backends = append(s.Backends, &lbdv1.Backend{Address: fmt.Sprintf("198.18.%d.%d", j+1, i%250+1), Port: 8080})
		}
		out[i] = s
	}
	return out
}

// reconciled runs a persisted store and a reconciler over the Fake, and a function that
// waits until the store reports the last change of every service as applied.
func reconciled(b *testing.B) (*store.Store, func()) {
	st, err := store.Open(store.Options{Path: filepath.Join(b.TempDir(), "state.pb"), Limits: store.DefaultLimits(), HoldIDs: true})
	if err != nil {
		b.Fatal(err)
	}
	// The reconciler reports each service it applied (a StatusOnly event that shows it
	// READY); done is signalled whenever no change waits for such a report.
	done := make(chan struct{}, 1)
	pending := map[string]bool{}
	_, _, stop := st.SnapshotAndListen(func(evs []store.Event) {
		for _, ev := range evs {
			switch {
			case ev.Type == store.Node:
			case !ev.StatusOnly:
				pending[ev.Name] = true
			case ev.Service.Spec.GetStatus().GetState() == lbdv1.ServiceState_SERVICE_STATE_READY:
				delete(pending, ev.Name)
			}
		}
		if len(pending) == 0 {
			select {
			case done <- struct{}{}:
			default:
			}
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- New(st, NewFake(), nil).Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		<-ran
		stop()
		st.Close()
	})
	return st, func() {
		select {
		case <-done:
		case <-time.After(time.Minute):
			b.Fatal("changes not reported applied within a minute")
		}
	}
}

// BenchmarkReconcileApply10k measures one ApplyServices of 10,000 services × 10
// backends into an empty store until every service is reported applied by the
// reconciler (over the Fake datapath).
func BenchmarkReconcileApply10k(b *testing.B) {
	svcs := benchServices(10000)
	for b.Loop() {
		b.StopTimer()
		st, wait := reconciled(b)
		b.StartTimer()
		if _, err := st.ApplyServices("bench", svcs); err != nil {
			b.Fatal(err)
		}
		wait()
	}
}

// BenchmarkReconcileWeightAt10k measures one weight change at 10,000 services, from the
// call until the reconciler reported it applied: p50-ms and p99-ms.
func BenchmarkReconcileWeightAt10k(b *testing.B) {
	svcs := benchServices(10000)
	st, wait := reconciled(b)
	if _, err := st.ApplyServices("bench", svcs); err != nil {
		b.Fatal(err)
	}
	wait()
	var times []time.Duration
	i := 0
	for b.Loop() {
		svc := svcs[i*7919%len(svcs)]
		be := svc.Backends[i%10]
		start := time.Now()
		if _, err := st.UpdateBackendFields(svc.Name, &lbdv1.Backend{Address: be.Address, Port: be.Port, Weight: uint32(2 + i%3)},
			store.BackendUpdate{Fields: []string{"weight"}}); err != nil {
			b.Fatal(err)
		}
		wait()
		times = append(times, time.Since(start))
		i++
	}
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2])/1e6, "p50-ms")
	b.ReportMetric(float64(times[min(len(times)-1, len(times)*99/100)])/1e6, "p99-ms")
}
