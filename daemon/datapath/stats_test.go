//go:build linux

package datapath

import (
	"context"
	"fmt"
	"github.com/lbd-dev/lbd/daemon/model/modeltest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/lbd-dev/lbd/bpf/lbxdp"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// counterValue is one CPU's struct lb_counter.
type counterValue struct{ Packets, Bytes, NewFlows uint64 }

// setCounters writes the counters of IDs (packets = v, bytes = 100 v, new flows = v / 10)
// into a pinned per-CPU counter map of the node, split over the CPUs as the program
// would leave them.
func setCounters(tb testing.TB, n *node, name string, values map[uint32]uint64) {
	tb.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(n.bpffs, "lb", name), nil)
	if err != nil {
		tb.Fatal(err)
	}
	defer m.Close()
	ncpu := ebpf.MustPossibleCPU()
	keys := make([]uint32, 0, len(values))
	vals := make([]counterValue, 0, len(values)*ncpu)
	for id, v := range values {
		keys = append(keys, id)
		for cpu := range ncpu {
			// The first CPU gets the remainder: the sums are exactly v, 100 v, v / 10.
			share := func(x uint64) uint64 {
				if cpu == 0 {
					return x/uint64(ncpu) + x%uint64(ncpu)
				}
				return x / uint64(ncpu)
			}
			vals = append(vals, counterValue{share(v), share(100 * v), share(v / 10)})
		}
	}
	if _, err := m.BatchUpdate(keys, vals, nil); err != nil {
		tb.Fatal(err)
	}
}

func statsLine(s *lbdv1.ServiceStats) string {
	parts := []string{fmt.Sprintf("%s %d/%d/%d", s.ServiceName, s.Packets, s.Bytes, s.NewFlows)}
	for _, b := range s.Backends {
		parts = append(parts, fmt.Sprintf("%s:%d %d", b.Address, b.Port, b.Packets))
	}
	return strings.Join(parts, " ")
}

// TestGetStats: GetStats reads the counters the program keeps (per CPU, summed) for the
// services a request selects, in its order and number, and refuses a bad request
// naming the field.
func TestGetStats(t *testing.T) {
	n := newNode(t)
	m := n.open(t, n.config(1024))
	svcs := []*lbdv1.Service{
		service(1, "web", "203.0.113.10", 80, 251,
			backend(1, "198.18.10.3", 8080, active), backend(2, "198.18.10.1", 8080, active), backend(3, "198.18.10.2", 8080, active)),
		service(2, "api", "203.0.113.10", 443, 251, backend(4, "198.18.10.4", 8443, active), backend(5, "198.18.10.4", 8444, active)),
		service(3, "dns", "203.0.113.11", 53, 251, backend(6, "198.18.10.5", 53, active)),
	}
	if _, err := m.Sync(context.Background(), modeltest.All(svcs...)); err != nil {
		t.Fatal(err)
	}
	setCounters(t, n, lbxdp.MapServiceStats, map[uint32]uint64{1: 100, 2: 300, 3: 200})
	setCounters(t, n, lbxdp.MapBackendStats, map[uint32]uint64{1: 50, 2: 20, 3: 30, 4: 100, 5: 200, 6: 200})
	ctx := context.Background()
	for _, c := range []struct {
		name string
		req  *lbdv1.GetStatsRequest
		want []string
	}{
		{"all, by name", &lbdv1.GetStatsRequest{}, []string{
			"api 300/30000/30 198.18.10.4:8443 100 198.18.10.4:8444 200",
			"dns 200/20000/20 198.18.10.5:53 200",
			"web 100/10000/10 198.18.10.1:8080 20 198.18.10.2:8080 30 198.18.10.3:8080 50",
		}},
		{"top 2 by packets", &lbdv1.GetStatsRequest{OrderBy: lbdv1.StatsOrder_STATS_ORDER_PACKETS, Limit: 2}, []string{
			"api 300/30000/30 198.18.10.4:8444 200 198.18.10.4:8443 100",
			"dns 200/20000/20 198.18.10.5:53 200",
		}},
		{"by new flows, a pattern", &lbdv1.GetStatsRequest{OrderBy: lbdv1.StatsOrder_STATS_ORDER_NEW_FLOWS, Services: []string{"w*", "dns"}}, []string{
			"dns 200/20000/20 198.18.10.5:53 200",
			"web 100/10000/10 198.18.10.3:8080 50 198.18.10.2:8080 30 198.18.10.1:8080 20",
		}},
		{"by bytes, without backends", &lbdv1.GetStatsRequest{OrderBy: lbdv1.StatsOrder_STATS_ORDER_BYTES, OmitBackends: true}, []string{
			"api 300/30000/30", "dns 200/20000/20", "web 100/10000/10",
		}},
		{"a pattern that matches nothing", &lbdv1.GetStatsRequest{Services: []string{"nothing-*"}}, nil},
	} {
		resp, err := m.GetStats(ctx, c.req)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var got []string
		for _, s := range resp.Services {
			got = append(got, statsLine(s))
		}
		if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
			t.Errorf("%s:\n%s\nwant\n%s", c.name, strings.Join(got, "\n"), strings.Join(c.want, "\n"))
		}
		if len(resp.Reasons) == 0 || len(resp.ConntrackEvents) == 0 {
			t.Errorf("%s: no reasons or conntrack events", c.name)
		}
	}
	for _, c := range []struct {
		req  *lbdv1.GetStatsRequest
		code codes.Code
		want string
	}{
		{&lbdv1.GetStatsRequest{Services: []string{"web", "nope"}}, codes.NotFound, `services: no service "nope"`},
		{&lbdv1.GetStatsRequest{Services: []string{"web", ""}}, codes.InvalidArgument, "services[1]"},
		{&lbdv1.GetStatsRequest{OrderBy: 99}, codes.InvalidArgument, "order_by"},
	} {
		_, err := m.GetStats(ctx, c.req)
		if status.Code(err) != c.code || !strings.Contains(status.Convert(err).Message(), c.want) {
			t.Errorf("GetStats(%v): %v, want %v naming %q", c.req, err, c.code, c.want)
		}
	}
}
