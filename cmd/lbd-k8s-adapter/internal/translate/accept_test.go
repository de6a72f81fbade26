package translate

import (
	"context"
	"testing"

	"github.com/lbd-dev/lbd/daemon/apitest"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestLbdAcceptsTranslations applies every translation of the table to lbd's real API: a
// name, field or combination that lbd's validation rejects would fail the whole apply of a
// cluster, so each output must be accepted as is.
func TestLbdAcceptsTranslations(t *testing.T) {
	srv := apitest.StartServer(t, store.DefaultLimits())
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial lbd: %v", err)
	}
	defer conn.Close()
	client := lbdv1.NewLoadBalancerServiceClient(conn)
	for _, tc := range translateCases() {
		opts := defaultOpts
		if tc.opts != nil {
			opts = *tc.opts
		}
		res := Service(tc.svc, tc.slices, testNodes, opts)
		if _, err := client.ApplyServices(context.Background(), &lbdv1.ApplyServicesRequest{Owner: "k8s-test", Services: res.Services}); err != nil {
			t.Errorf("%s: lbd rejects the translation: %v", tc.name, err)
		}
	}
}
