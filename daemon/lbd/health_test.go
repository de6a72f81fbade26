package lbd

import (
	"context"
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestHealthStartsNotServing: the API listens before the datapath is open, and a
// client that checks health before serveHealth first runs must not see a ready node
// (the scale benchmark did, and its first change was refused as the datapath was
// still opening).
func TestHealthStartsNotServing(t *testing.T) {
	res, err := notServing().Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health before the first readiness check: %v, want NOT_SERVING", res.Status)
	}
}
