package lbd

import (
	"fmt"
	"testing"

	"github.com/lbd-dev/lbd/bpf/lbxdp"
	"github.com/lbd-dev/lbd/daemon/config"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// TestMapsHoldStoreIDs: the maps that service and backend IDs index are sized from the
// store's limits, so that a store filled to its limits hands out no ID the maps cannot
// hold, whatever the programs' compiled-in sizes.
func TestMapsHoldStoreIDs(t *testing.T) {
	small := config.Default()
	small.Limits.MaxServices, small.Limits.MaxBackendsPerService, small.Limits.MaxBackends = 3, 2, 5
	large := config.Default()
	large.Limits.MaxServices, large.Limits.MaxBackends = 2*int(lbxdp.DefaultMaxServices), 2*int(lbxdp.DefaultMaxBackends)
	for name, cfg := range map[string]config.Config{"default": config.Default(), "small": small, "above the compiled-in sizes": large} {
		t.Run(name, func(t *testing.T) {
			dc, err := datapathConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			spec, err := lbxdp.Spec(lbxdp.Options{MaxServices: dc.MaxServices, MaxBackends: dc.MaxBackends})
			if err != nil {
				t.Fatal(err)
			}
			// Array maps: an ID is an index, the highest the store hands out is the limit.
			for _, c := range []struct {
				maps  []string
				limit int
			}{
				{[]string{lbxdp.MapServiceStats, lbxdp.MapTables}, cfg.Limits.MaxServices},
				{[]string{lbxdp.MapBackends, lbxdp.MapBackendStats}, cfg.Limits.MaxBackends},
			} {
				for _, m := range c.maps {
					if got := spec.Maps[m].MaxEntries; got <= uint32(c.limit) {
						t.Errorf("map %s holds IDs up to %d, the store hands out up to %d", m, got-1, c.limit)
					}
				}
			}
			if got := spec.Maps[lbxdp.MapServices].MaxEntries; got < uint32(cfg.Limits.MaxServices) {
				t.Errorf("map %s holds %d services, the store up to %d", lbxdp.MapServices, got, cfg.Limits.MaxServices)
			}
		})
	}

	// The store, filled to small limits, hands out IDs up to the limits and no further.
	st, err := store.Open(store.Options{Limits: small.Limits})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var maxSvc, maxBe uint32
	for i := range small.Limits.MaxServices {
		svc := &lbdv1.Service{Name: fmt.Sprintf("s%d", i), Vip: "203.0.113.1", Port: uint32(80 + i), Protocol: lbdv1.Protocol_PROTOCOL_TCP}
		for j := range 2 {
			if i*2+j < small.Limits.MaxBackends {
				svc.Backends = append(svc.Backends, &lbdv1.Backend{Address: fmt.Sprintf("198.18.0.%d", i*2+j+1), Port: 80})
			}
		}
		got, err := st.CreateService(svc)
		if err != nil {
			t.Fatalf("create %s: %v", svc.Name, err)
		}
		maxSvc = max(maxSvc, got.Id)
		for _, b := range got.Backends {
			maxBe = max(maxBe, b.Id)
		}
	}
	if maxSvc != uint32(small.Limits.MaxServices) || maxBe != uint32(small.Limits.MaxBackends) {
		t.Errorf("highest IDs handed out: service %d, backend %d; want the limits %d and %d",
			maxSvc, maxBe, small.Limits.MaxServices, small.Limits.MaxBackends)
	}
}
