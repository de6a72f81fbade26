// Command client is a small example of programming lbd over its gRPC API: it declares
// one service with two backends through ApplyServices, so running it again changes
// nothing, and prints the service's status.
//
//	go run ./examples/client -server unix:///run/lbd/lbd.sock
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
)

func main() {
	server := flag.String("server", "unix:///run/lbd/lbd.sock", "lbd API address (Unix socket)")
	flag.Parse()
	if err := run(*server); err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(1)
	}
}

func run(server string) error {
	// The Unix socket needs no TLS: its file mode guards it.
	conn, err := grpc.NewClient(server, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial %s: %w", server, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	lb := lbdv1.NewLoadBalancerServiceClient(conn)
	web := &lbdv1.Service{
		Name:     "example-web",
		Vip:      "203.0.113.10",
		Port:     80,
		Protocol: lbdv1.Protocol_PROTOCOL_TCP,
		SessionAffinity: &lbdv1.SessionAffinity{
			Timeout: durationpb.New(10 * time.Minute),
		},
		HealthCheck: &lbdv1.HealthCheck{Type: lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_HTTP, Path: "/healthz"},
		Backends: []*lbdv1.Backend{
			{Address: "198.18.1.10", Port: 8080},
			{Address: "198.18.1.11", Port: 8080, Weight: 2},
		},
	}
	res, err := lb.ApplyServices(ctx, &lbdv1.ApplyServicesRequest{Owner: "example-client", Services: []*lbdv1.Service{web}})
	if err != nil {
		return fmt.Errorf("apply services: %w", err)
	}
	fmt.Printf("applied: %d created, %d updated, %d deleted, %d unchanged\n", res.Created, res.Updated, res.Deleted, res.Unchanged)
	got, err := lb.GetService(ctx, &lbdv1.GetServiceRequest{Name: web.Name})
	if err != nil {
		return fmt.Errorf("get service: %w", err)
	}
	st := got.Service.Status
	fmt.Printf("%s %s:%d: %s (%s)\n", got.Service.Name, got.Service.Vip, got.Service.Port, st.State, st.Reason)
	return nil
}
