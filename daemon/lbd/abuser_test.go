package lbd_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// The abusive clients run in a process of their own, as they would on other machines:
// in the test's process, their goroutines would queue the legitimate client's behind
// them, and the benchmark would measure Go's scheduler instead of lbd.

// abuserEnv makes the test binary, started as a helper, the abusers' process (TestMain):
// it reads an abuserSpec from the variable, abuses until its stdin closes, and prints
// an abuserResult.
const abuserEnv = "LBD_TEST_ABUSER"

type abuserSpec struct {
	Addr          string
	CA, Cert, Key []byte
	N             int
	// Kinds are the abuses the clients take turns at: kindOversized, kindFlood,
	// kindUnread.
	Kinds []int
}

// Kinds of abuse.
const (
	kindOversized = iota
	kindFlood
	kindUnread
)

var allKinds = []int{kindOversized, kindFlood, kindUnread}

type abuserResult struct {
	Oversized, Limited, Streams int64
	Unexpected                  []string
}

// abuseTally counts what the abusers were answered.
type abuseTally struct {
	oversized, limited, streams atomic.Int64
	mu                          sync.Mutex
	unexpected                  map[string]error // abuse kind → last unexpected error
}

func (t *abuseTally) fail(kind string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.unexpected[kind] = err
}

// rawCodec sends bytes as they are: the oversized clients' requests cost them no
// encoding.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)   { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(b []byte, v any) error { *v.(*[]byte) = b; return nil }
func (rawCodec) Name() string                    { return "proto" }

// abuse starts the abusers' process with n clients taking turns at kinds; the returned
// function stops it and returns what they were answered.
func (e *abuseEnv) abuse(tb testing.TB, n int, kinds []int) func() abuserResult {
	tb.Helper()
	spec, err := json.Marshal(abuserSpec{Addr: e.addr, CA: e.caPEM, Cert: e.abuserCert, Key: e.abuserKey, N: n, Kinds: kinds})
	if err != nil {
		tb.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), abuserEnv+"="+string(spec))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start the abusers: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stopped := false
	stop := func() abuserResult {
		stopped = true
		stdin.Close()
		select {
		case err := <-done:
			if err != nil {
				tb.Fatalf("the abusers' process: %v: %s", err, errOut.String())
			}
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			tb.Fatalf("the abusers' process did not stop: %s", errOut.String())
		}
		var r abuserResult
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			tb.Fatalf("the abusers' result %q: %v (%s)", out.String(), err, errOut.String())
		}
		return r
	}
	tb.Cleanup(func() {
		if !stopped {
			cmd.Process.Kill()
			<-done
		}
	})
	return stop
}

// rateLimited reports whether err is lbd's refusal of a call above its principal's
// rate or open calls (api.rate_limit).
func rateLimited(err error) bool {
	s, ok := status.FromError(err)
	return ok && s.Code() == codes.ResourceExhausted && strings.HasPrefix(s.Message(), "rate limit: ")
}

// abuserMain is the abusers' process.
func abuserMain(specJSON string) int {
	var s abuserSpec
	if err := json.Unmarshal([]byte(specJSON), &s); err != nil {
		fmt.Fprintln(os.Stderr, "spec:", err)
		return 1
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(s.CA)
	cert, err := tls.X509KeyPair(s.Cert, s.Key)
	if err != nil {
		fmt.Fprintln(os.Stderr, "certificate:", err)
		return 1
	}
	dial := func(opts ...grpc.DialOption) (*grpc.ClientConn, error) {
		return grpc.NewClient(s.Addr, append(opts, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			RootCAs: roots, ServerName: "127.0.0.1", Certificates: []tls.Certificate{cert}})))...)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	tally := &abuseTally{unexpected: map[string]error{}}
	big := make([]byte, abuseOversize)
	for i := range s.N {
		// A fixed window turns off gRPC's window growth, so a client that does not read
		// stops the server's sends at 64 KiB.
		conn, err := dial(grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))
		if err != nil {
			fmt.Fprintln(os.Stderr, "dial:", err)
			return 1
		}
		defer conn.Close()
		switch s.Kinds[i%len(s.Kinds)] {
		case kindOversized:
			wg.Go(func() {
				for ctx.Err() == nil {
					var out []byte
					err := conn.Invoke(ctx, lbdv1.LoadBalancerService_ApplyServices_FullMethodName, &big, &out, grpc.ForceCodec(rawCodec{}))
					switch {
					case rateLimited(err):
						tally.limited.Add(1)
					case status.Code(err) == codes.ResourceExhausted:
						tally.oversized.Add(1)
					case ctx.Err() == nil:
						tally.fail("oversized", err)
					}
				}
			})
		case kindFlood: // far above the rate limit
			node := lbdv1.NewNodeServiceClient(conn)
			wg.Go(func() {
				for ctx.Err() == nil {
					_, err := node.GetNode(ctx, &lbdv1.GetNodeRequest{})
					switch {
					case rateLimited(err):
						tally.limited.Add(1)
					case err != nil && ctx.Err() == nil:
						tally.fail("flood", err)
					}
				}
			})
		case kindUnread: // streams that never read
			lb := lbdv1.NewLoadBalancerServiceClient(conn)
			wg.Go(func() {
				for ctx.Err() == nil {
					sctx, scancel := context.WithTimeout(ctx, 3*abuseSendTimeout)
					if _, err := lb.WatchServices(sctx, &lbdv1.WatchServicesRequest{}); err == nil {
						tally.streams.Add(1)
					}
					<-sctx.Done()
					scancel()
				}
			})
		}
	}
	io.Copy(io.Discard, os.Stdin) // until the test closes it
	cancel()
	wg.Wait()
	r := abuserResult{Oversized: tally.oversized.Load(), Limited: tally.limited.Load(), Streams: tally.streams.Load()}
	for k, err := range tally.unexpected {
		r.Unexpected = append(r.Unexpected, fmt.Sprintf("%s: %v", k, err))
	}
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		fmt.Fprintln(os.Stderr, "result:", err)
		return 1
	}
	return 0
}
