//go:build linux

package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestMemoryBudget: an LB node with a small datapath.memory_budget takes services until
// their Maglev tables fill what the budget leaves, then refuses the next one with
// RESOURCE_EXHAUSTED and the numbers, changing nothing; the services it took are
// programmed and forward.
func TestMemoryBudget(t *testing.T) {
	tb := newLB(t, options{lbs: 1, datapathYAML: ", memory_budget: 256MiB"})
	d := tb.lbs[0].lbd
	svc := func(i int) *lbdv1.Service {
		return &lbdv1.Service{Name: fmt.Sprintf("big-%d", i), Vip: "203.0.113.20", Port: uint32(1000 + i),
			Protocol: lbdv1.Protocol_PROTOCOL_TCP, MaglevTableSize: 131071,
			Backends: []*lbdv1.Backend{{Address: tb.backends[0].addr4.String(), Port: httpPort}}}
	}
	var err error
	created := 0
	for ; created < 200; created++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = d.lb.CreateService(ctx, &lbdv1.CreateServiceRequest{Service: svc(created)})
		cancel()
		if err != nil {
			break
		}
	}
	st, _ := status.FromError(err)
	if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "datapath.memory_budget (256.0 MiB)") {
		t.Fatalf("after %d services of 2 MiB tables: %v, want RESOURCE_EXHAUSTED naming the budget", created, err)
	}
	t.Logf("took %d services with 131071-slot tables, then: %s", created, st.Message())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, lerr := d.lb.ListServices(ctx, &lbdv1.ListServicesRequest{})
	if lerr != nil || len(list.GetServices()) != created+3 {
		t.Fatalf("%d services listed after the refusal (%v), want the %d created and the 3 defaults", len(list.GetServices()), lerr, created)
	}
	tb.waitService(t, fmt.Sprintf("big-%d", created-1), func(s *lbdv1.Service) error {
		if s.GetStatus().GetState() != lbdv1.ServiceState_SERVICE_STATE_READY {
			return fmt.Errorf("%v: %s", s.GetStatus().GetState(), s.GetStatus().GetReason())
		}
		return nil
	})
}
