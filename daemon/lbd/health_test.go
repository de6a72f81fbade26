package lbd

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
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

// TestHealthFollowsReadyChange: gRPC health turns SERVING as soon as serveHealth is told
// that readiness changed (the first sync done), not at its next look, which this test
// puts an hour away.
func TestHealthFollowsReadyChange(t *testing.T) {
	hs := notServing()
	var ready atomic.Bool
	changed := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	// looked is closed by serveHealth's first look, which finds the node not ready.
	looked := make(chan struct{})
	var once sync.Once
	readyNow := func() (bool, string) {
		ok := ready.Load()
		once.Do(func() { close(looked) })
		return ok, ""
	}
	go func() {
		defer close(done)
		serveHealth(ctx, hs, grpc.NewServer(), readyNow, changed, time.Hour)
	}()
	defer func() { cancel(); <-done }()
	status := func() healthpb.HealthCheckResponse_ServingStatus {
		res, err := hs.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return res.Status
	}
	<-looked
	ready.Store(true)
	changed <- struct{}{}
	deadline := time.Now().Add(10 * time.Second)
	for status() != healthpb.HealthCheckResponse_SERVING {
		if time.Now().After(deadline) {
			t.Fatal("health still NOT_SERVING 10 s after readiness changed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
