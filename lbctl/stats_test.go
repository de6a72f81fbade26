package lbctl

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/lbd-dev/lbd/daemon/apitest"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// TestStatsTopTalkers: --service, --sort, --top and --no-backends reach the server as
// the request's fields, and the table keeps the order by the counter.
func TestStatsTopTalkers(t *testing.T) {
	t.Parallel()
	f := &fakeDatapath{stats: &lbdv1.GetStatsResponse{Services: []*lbdv1.ServiceStats{
		{ServiceName: "api", Packets: 10, Bytes: 9000, NewFlows: 1},
		{ServiceName: "web", Packets: 500, Bytes: 1000, NewFlows: 7, Backends: []*lbdv1.BackendStats{
			{Address: "198.18.1.1", Port: 80, Packets: 100}, {Address: "198.18.1.2", Port: 80, Packets: 400}}},
	}}}
	srv := startFake(t, f)
	got := ok(t, srv, "stats", "--service", "web", "--service", "a*", "--sort", "packets", "--top", "1")
	want := "SERVICE/BACKEND  PACKETS  BYTES  NEW FLOWS\nweb              500      1000   7\n  198.18.1.2:80  400      0      0\n  198.18.1.1:80  100      0      0\n"
	if got != want {
		t.Errorf("stats --sort packets --top 1:\n%s\nwant:\n%s", got, want)
	}
	if got := ok(t, srv, "stats", "--sort", "bytes", "--no-backends"); !strings.HasPrefix(got, "SERVICE/BACKEND  PACKETS  BYTES  NEW FLOWS\napi ") {
		t.Errorf("stats --sort bytes: api (9000 bytes) is not first:\n%s", got)
	}
	f.mu.Lock()
	reqs := f.statsReq
	f.mu.Unlock()
	if w := (&lbdv1.GetStatsRequest{Services: []string{"web", "a*"}, OrderBy: lbdv1.StatsOrder_STATS_ORDER_PACKETS, Limit: 1}); !proto.Equal(reqs[0], w) {
		t.Errorf("request %v, want %v", reqs[0], w)
	}
	if w := (&lbdv1.GetStatsRequest{OrderBy: lbdv1.StatsOrder_STATS_ORDER_BYTES, OmitBackends: true}); !proto.Equal(reqs[1], w) {
		t.Errorf("request %v, want %v", reqs[1], w)
	}
	if r := lbctl(t, srv, "stats", "--sort", "weight"); r.code != ExitUsage || !strings.Contains(r.stderr, "packets") {
		t.Errorf("stats --sort weight: exit %d, %q", r.code, r.stderr)
	}
	if r := lbctl(t, srv, "stats", "--interval", "1ms"); r.code != ExitUsage || !strings.Contains(r.stderr, "--interval") {
		t.Errorf("stats --interval 1ms: exit %d, %q", r.code, r.stderr)
	}
}

// TestStatsInterval: with --interval the table shows what happened between two reads,
// each backend's share of the new flows next to its share of the Maglev table: the
// backend that takes 90% of the new flows with a quarter of the slots is the hot one,
// the one with slots and no new flow the dead one.
func TestStatsInterval(t *testing.T) {
	t.Parallel()
	be := func(addr string, p, nf uint64) *lbdv1.BackendStats {
		return &lbdv1.BackendStats{Address: addr, Port: 80, Packets: p, NewFlows: nf}
	}
	f := &fakeDatapath{statsSeq: []*lbdv1.GetStatsResponse{
		{Services: []*lbdv1.ServiceStats{{ServiceName: "web", Packets: 100, NewFlows: 20, Backends: []*lbdv1.BackendStats{
			be("198.18.1.1", 50, 10), be("198.18.1.2", 50, 10), be("198.18.1.3", 0, 0)}}},
			Reasons: []*lbdv1.Counter{{Name: "lb_drop_no_backend", Packets: 5}}},
		{Services: []*lbdv1.ServiceStats{{ServiceName: "web", Packets: 1100, NewFlows: 120, Backends: []*lbdv1.BackendStats{
			be("198.18.1.1", 950, 100), be("198.18.1.2", 150, 20), be("198.18.1.3", 0, 0)}}},
			Reasons: []*lbdv1.Counter{{Name: "lb_drop_no_backend", Packets: 5}}},
	}}
	srv := apitest.StartWithDatapath(t, store.DefaultLimits(), f)
	svc, err := srv.Store.CreateService(&lbdv1.Service{Name: "web", Vip: "203.0.113.10", Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP,
		Backends: []*lbdv1.Backend{{Address: "198.18.1.1", Port: 80}, {Address: "198.18.1.2", Port: 80}, {Address: "198.18.1.3", Port: 80}}})
	if err != nil {
		t.Fatal(err)
	}
	slots := map[uint32]uint32{svc.Backends[0].Id: 250, svc.Backends[1].Id: 500, svc.Backends[2].Id: 250}
	if err := srv.Store.ReportDatapath("web", svc.Revision, 0, nil, slots); err != nil {
		t.Fatal(err)
	}
	out := ok(t, srv.Addr, "stats", "--service", "web", "--sort", "new-flows", "--interval", "100ms")
	lines := strings.Split(out, "\n")
	if !strings.HasPrefix(lines[0], "SERVICE/BACKEND") || !strings.Contains(lines[0], "NEW FLOWS/S") || !strings.HasSuffix(lines[0], "SHARE  SLOTS") {
		t.Fatalf("header %q", lines[0])
	}
	for i, want := range []string{"198.18.1.1:80 ", "198.18.1.2:80 ", "198.18.1.3:80 "} {
		if !strings.HasPrefix(strings.TrimSpace(lines[2+i]), want) {
			t.Fatalf("line %d %q, want %s first (by new flows)\n%s", 2+i, lines[2+i], want, out)
		}
	}
	for i, want := range []string{"90.0%  25.0%", "10.0%  50.0%", "0.0%   25.0%"} {
		if !strings.HasSuffix(lines[2+i], want) {
			t.Errorf("line %q: want share and slots %q", lines[2+i], want)
		}
	}
	if !strings.Contains(out, "lb_drop_no_backend  0.0") {
		t.Errorf("the reasons are not rates of the interval:\n%s", out)
	}

	var d lbdv1.GetStatsResponse
	parseJSON(t, ok(t, srv.Addr, "stats", "--interval", "100ms", "-o", "json"), &d)
	if s := d.Services[0]; s.Packets != 1000 || s.NewFlows != 100 || s.Backends[0].NewFlows != 90 || s.Backends[2].Packets != 0 {
		t.Errorf("stats --interval -o json: %v, want the counts of the interval", &d)
	}
}
