package lbd_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// TestLimitsBeforeRead: the rate and open-call limits of a principal are applied to a
// call's headers, before lbd reads its request. A request larger than lbd accepts is
// refused for its size while its principal is within its rate, and by the rate limit
// once above it (were the rate checked after the request was read, the size would
// refuse it first, every time). A principal with api.rate_limit.max_streams streams open
// is refused another until one of them ends, and may still make unary calls.
func TestLimitsBeforeRead(t *testing.T) {
	f := newTLSFixture(t)
	in := newInstance(t)
	dir := filepath.Dir(in.socket)
	addr := freePort(t)
	const sender, watcher = "spiffe://lbd.test/sender", "spiffe://lbd.test/watcher"
	policy := writeFile(t, dir, "policy.yaml", fmt.Appendf(nil, "rules:\n  - role: reader\n    principals: [%q, %q]\n", sender, watcher))
	cfg := writeFile(t, dir, "lbd.yaml", fmt.Appendf(nil, "api:\n  policy_file: %s\n  max_recv_msg_bytes: 65536\n"+
		"  rate_limit:\n    rate: 2\n    burst: 3\n    max_open: 3\n    max_streams: 2\n", policy))
	startLBD(t, in, append(f.args(addr), "--config", cfg)...)
	roots := x509.NewCertPool()
	roots.AddCert(f.ca.Cert)
	dial := func(uri string) *grpc.ClientConn {
		cert := principalCert(t, f.ca, uri, pkix.Name{CommonName: uri})
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			RootCAs: roots, ServerName: "127.0.0.1", Certificates: []tls.Certificate{cert}})))
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}

	t.Run("oversized", func(t *testing.T) {
		conn := dial(sender)
		big := make([]byte, 256<<10)
		// Within the burst of 3, each is refused for its size; then by the rate.
		var codesSeen []string
		for i := 0; i < 10 && !slices.Contains(codesSeen, "rate"); i++ {
			var out []byte
			err := conn.Invoke(ctxT(t), lbdv1.LoadBalancerService_ApplyServices_FullMethodName, &big, &out, grpc.ForceCodec(rawCodec{}))
			switch {
			case rateLimited(err):
				codesSeen = append(codesSeen, "rate")
			case status.Code(err) == codes.ResourceExhausted:
				codesSeen = append(codesSeen, "size")
			default:
				t.Fatalf("oversized request %d: %v, want RESOURCE_EXHAUSTED", i, err)
			}
		}
		if len(codesSeen) < 2 || codesSeen[0] != "size" || codesSeen[len(codesSeen)-1] != "rate" {
			t.Fatalf("refusals of oversized requests sent in a row: %v; want the size limit within the burst, then the rate limit", codesSeen)
		}
	})

	t.Run("open", func(t *testing.T) {
		conn := dial(watcher)
		lb := lbdv1.NewLoadBalancerServiceClient(conn)
		// watch opens a watch and returns once lbd has answered it (SYNCED: the store is
		// empty) or refused it.
		watch := func() (context.CancelFunc, error) {
			ctx, cancel := context.WithCancel(ctxT(t))
			s, err := lb.WatchServices(ctx, &lbdv1.WatchServicesRequest{})
			if err == nil {
				_, err = s.Recv()
			}
			if err != nil {
				cancel()
			}
			return cancel, err
		}
		var open []context.CancelFunc
		for i := range 2 {
			end, err := watch()
			if err != nil {
				t.Fatalf("watch %d of max_streams 2: %v", i, err)
			}
			open = append(open, end)
		}
		if _, err := watch(); !rateLimited(err) || !strings.Contains(err.Error(), "max_streams") {
			t.Fatalf("a third watch while two are open: %v, want a refusal naming api.rate_limit.max_streams", err)
		}
		if _, err := lbdv1.NewNodeServiceClient(conn).GetNode(ctxT(t), &lbdv1.GetNodeRequest{}); err != nil {
			t.Fatalf("a unary call while two watches are open: %v", err)
		}
		open[0]()
		// lbd counts the watch ended once it has seen the client's cancellation.
		deadline := time.Now().Add(10 * time.Second)
		for {
			end, err := watch()
			if err == nil {
				defer end()
				break
			}
			if !rateLimited(err) || time.Now().After(deadline) {
				t.Fatalf("a watch after one of two ended: %v", err)
			}
		}
		defer open[1]()
	})
}
