package lbctl

import (
	"fmt"
	"testing"

	"github.com/lbd-dev/lbd/daemon/apitest"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// servedServices serves the real API in process with n services × 10 backends.
func servedServices(tb testing.TB, n int) string {
	tb.Helper()
	srv := apitest.StartServer(tb, store.DefaultLimits())
	svcs := make([]*lbdv1.Service, n)
	for i := range n {
		s := &lbdv1.Service{Name: fmt.Sprintf("ns-%d/svc-%d", i/100, i), Vip: fmt.Sprintf("203.0.113.%d", i%250+1),
			Port: uint32(1000 + i/250), Protocol: lbdv1.Protocol_PROTOCOL_TCP}
		for j := range 10 {
			s.Backends = append(s.Backends, &lbdv1.Backend{Address: fmt.Sprintf("198.18.%d.%d", j+1, i%250+1), Port: 8080})
		}
		svcs[i] = s
	}
	if _, err := srv.Store.ApplyServices("bench", svcs); err != nil {
		tb.Fatal(err)
	}
	return srv.Addr
}

// BenchmarkServiceList10k measures `lbctl service list` of 10,000 services × 10
// backends, in each output format, against the real API in process.
func BenchmarkServiceList10k(b *testing.B) {
	srv := servedServices(b, 10000)
	for _, format := range []string{"table", "json", "yaml"} {
		b.Run(format, func(b *testing.B) {
			for b.Loop() {
				r := lbctl(b, srv, "-o", format, "service", "list")
				if r.code != ExitOK || len(r.stdout) < 10000 {
					b.Fatalf("exit %d: %s", r.code, r.stderr)
				}
			}
		})
	}
}
