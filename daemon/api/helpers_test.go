package api_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/daemon/api"
	"github.com/lbd-dev/lbd/daemon/apitest"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

type clients struct {
	lb   lbdv1.LoadBalancerServiceClient
	bgp  lbdv1.BgpServiceClient
	node lbdv1.NodeServiceClient
	srv  *apitest.Server
}

// start serves the API with small limits, so limit checks are cheap to reach.
func start(t testing.TB) *clients {
	t.Helper()
	lim := store.DefaultLimits()
	lim.MaxServices = 50
	lim.MaxBackendsPerService = 8
	lim.MaxSourceRanges = 4
	lim.MaxBgpPeers = 3
	return startWith(t, lim)
}

func startWith(t testing.TB, lim store.Limits) *clients {
	t.Helper()
	return startOpts(t, lim, api.Options{})
}

// startOpts serves the API with limits and options (watch bounds, datapath).
func startOpts(t testing.TB, lim store.Limits, opts api.Options) *clients {
	t.Helper()
	srv := apitest.StartWithOptions(t, lim, opts)
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return &clients{
		lb:   lbdv1.NewLoadBalancerServiceClient(conn),
		bgp:  lbdv1.NewBgpServiceClient(conn),
		node: lbdv1.NewNodeServiceClient(conn),
		srv:  srv,
	}
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func bg() context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	_ = cancel // released when the deadline passes; these calls are short
	return c
}

func itoa(i int) string { return strconv.Itoa(i) }
