package lbctl

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lbd-dev/lbd/daemon/apitest"
	"github.com/lbd-dev/lbd/daemon/model"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// fakeDatapath answers the datapath RPCs with canned responses and records the requests
// that reached the server.
type fakeDatapath struct {
	trace *lbdv1.TraceFlowResponse
	conns *lbdv1.ListConnectionsResponse
	stats *lbdv1.GetStatsResponse
	// statsSeq, when set, answers the GetStats calls in turn, over and over.
	statsSeq []*lbdv1.GetStatsResponse
	socks    *lbdv1.ListSocketTranslationsResponse
	// sockAgo sets the creation time of socks' entries relative to the time of the call.
	sockAgo []time.Duration
	// seenAgo sets the last-seen time of conns' entries relative to the time of the call;
	// entries beyond it keep no time.
	seenAgo []time.Duration

	mu       sync.Mutex
	traces   []model.Flow
	lists    []*lbdv1.ListConnectionsRequest
	sockReqs []*lbdv1.ListSocketTranslationsRequest
	statsN   int
	statsReq []*lbdv1.GetStatsRequest
	detaches int
	detached bool
	// hops and drift answer GetNode's next hops and VerifyNode.
	hops  []*lbdv1.NextHop
	drift []*lbdv1.Drift
}

func (f *fakeDatapath) TraceFlow(_ context.Context, r model.Flow) (*lbdv1.TraceFlowResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.traces = append(f.traces, r)
	return f.trace, nil
}

func (f *fakeDatapath) ListConnections(_ context.Context, r *lbdv1.ListConnectionsRequest) (*lbdv1.ListConnectionsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists = append(f.lists, r)
	resp := proto.Clone(f.conns).(*lbdv1.ListConnectionsResponse)
	if r.CountOnly {
		return &lbdv1.ListConnectionsResponse{MatchedCount: uint64(len(resp.Connections))}, nil
	}
	for i, ago := range f.seenAgo {
		resp.Connections[i].LastSeenTime = timestamppb.New(time.Now().Add(-ago))
	}
	return resp, nil
}

func (f *fakeDatapath) ListSocketTranslations(_ context.Context, r *lbdv1.ListSocketTranslationsRequest) (*lbdv1.ListSocketTranslationsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sockReqs = append(f.sockReqs, r)
	resp := proto.Clone(f.socks).(*lbdv1.ListSocketTranslationsResponse)
	for i, ago := range f.sockAgo {
		resp.Translations[i].CreateTime = timestamppb.New(time.Now().Add(-ago))
	}
	return resp, nil
}

func (f *fakeDatapath) GetStats(_ context.Context, r *lbdv1.GetStatsRequest) (*lbdv1.GetStatsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.statsN++
	f.statsReq = append(f.statsReq, r)
	if len(f.statsSeq) > 0 {
		return f.statsSeq[(f.statsN-1)%len(f.statsSeq)], nil
	}
	return f.stats, nil
}

func (f *fakeDatapath) Detach(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.detaches++
	f.detached = true
	return nil
}

func (f *fakeDatapath) Attached() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.detached
}

func (f *fakeDatapath) Ready() (bool, string) {
	if !f.Attached() {
		return false, "the datapath is detached"
	}
	return true, "datapath attached"
}

func (f *fakeDatapath) NextHops() []*lbdv1.NextHop { return f.hops }

func (f *fakeDatapath) Verify(context.Context) ([]*lbdv1.Drift, error) { return f.drift, nil }

func (f *fakeDatapath) DriftCounts() map[string]uint64 {
	out := map[string]uint64{}
	for _, d := range f.drift {
		out[d.Kind]++
	}
	return out
}

// calls is the number of requests each RPC received.
func (f *fakeDatapath) calls() [4]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return [4]int{len(f.traces), len(f.lists), f.statsN, f.detaches}
}

// requests returns the trace and list requests received so far.
func (f *fakeDatapath) requests() ([]model.Flow, []*lbdv1.ListConnectionsRequest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.traces), slices.Clone(f.lists)
}

func startFake(t *testing.T, f *fakeDatapath) string {
	t.Helper()
	return apitest.StartWithDatapath(t, store.DefaultLimits(), f).Addr
}

func TestStats(t *testing.T) {
	t.Parallel()
	// Unsorted, as a daemon may send them.
	f := &fakeDatapath{stats: &lbdv1.GetStatsResponse{
		Services: []*lbdv1.ServiceStats{
			{ServiceName: "web", Packets: 1500, Bytes: 120000, NewFlows: 30, Backends: []*lbdv1.BackendStats{
				{Address: "198.18.1.10", Port: 80, Packets: 700, Bytes: 56000, NewFlows: 14},
				{Address: "198.18.1.9", Port: 8080, Packets: 0, Bytes: 0, NewFlows: 0},
				{Address: "198.18.1.10", Port: 79, Packets: 800, Bytes: 64000, NewFlows: 16},
			}},
			{ServiceName: "api6", Packets: 12, Bytes: 1024, NewFlows: 2, Backends: []*lbdv1.BackendStats{
				{Address: "2001:db8::10", Port: 443, Packets: 5, Bytes: 400, NewFlows: 1},
				{Address: "2001:db8::2", Port: 443, Packets: 7, Bytes: 624, NewFlows: 1},
			}},
		},
		Reasons: []*lbdv1.Counter{
			{Name: "lb_drop_no_backend", Packets: 3, Bytes: 180},
			{Name: "backend_nat_miss", Packets: 7},
			{Name: "lb_drop_bad_source", Packets: 0},
		},
	}}
	srv := startFake(t, f)

	want := `SERVICE/BACKEND       PACKETS  BYTES   NEW FLOWS
api6                  12       1024    2
  [2001:db8::2]:443   7        624     1
  [2001:db8::10]:443  5        400     1
web                   1500     120000  30
  198.18.1.9:8080     0        0       0
  198.18.1.10:79      800      64000   16
  198.18.1.10:80      700      56000   14

REASON              PACKETS
backend_nat_miss    7
lb_drop_bad_source  0
lb_drop_no_backend  3
`
	if got := ok(t, srv, "stats"); got != want {
		t.Errorf("stats:\n%s\nwant:\n%s", got, want)
	}

	var resp lbdv1.GetStatsResponse
	parseJSON(t, ok(t, srv, "stats", "-o", "json"), &resp)
	var order []string
	for _, s := range resp.Services {
		order = append(order, s.ServiceName)
		for _, b := range s.Backends {
			order = append(order, formatEndpoint(b.Address, b.Port))
		}
	}
	for _, r := range resp.Reasons {
		order = append(order, r.Name)
	}
	wantOrder := "[api6 [2001:db8::2]:443 [2001:db8::10]:443 web 198.18.1.9:8080 198.18.1.10:79 198.18.1.10:80 backend_nat_miss lb_drop_bad_source lb_drop_no_backend]"
	if got := fmt.Sprint(order); got != wantOrder {
		t.Errorf("stats -o json order: %s, want %s", got, wantOrder)
	}
	if resp.Reasons[2].Bytes != 180 || resp.Services[1].Backends[1].NewFlows != 16 {
		t.Errorf("stats -o json lost counters: %v", &resp)
	}
	var fromYAML lbdv1.GetStatsResponse
	parseYAML(t, ok(t, srv, "stats", "-o", "yaml"), &fromYAML)
	if !proto.Equal(&fromYAML, &resp) {
		t.Errorf("stats -o yaml differs from -o json:\n%v\n%v", &fromYAML, &resp)
	}
	if c := f.calls(); c[2] != 3 {
		t.Errorf("GetStats called %d times for 3 runs", c[2])
	}
}

func TestStatsSections(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		stats *lbdv1.GetStatsResponse
		want  string
	}{
		{"empty", &lbdv1.GetStatsResponse{}, "No counters: the datapath has no service and reports no reason.\n"},
		{"backend node", &lbdv1.GetStatsResponse{Reasons: []*lbdv1.Counter{{Name: "backend_decap", Packets: 9}}},
			"REASON         PACKETS\nbackend_decap  9\n"},
		{"no reasons", &lbdv1.GetStatsResponse{Services: []*lbdv1.ServiceStats{{ServiceName: "dns", Packets: 1, Bytes: 60, NewFlows: 1}}},
			"SERVICE/BACKEND  PACKETS  BYTES  NEW FLOWS\ndns              1        60     1\n"},
		{"socket-level only", &lbdv1.GetStatsResponse{SocketEvents: []*lbdv1.EventCounter{{Name: "no_backend", Count: 2}, {Name: "connect", Count: 40}}},
			"SOCKET EVENT  CALLS\nconnect       40\nno_backend    2\n"},
		{"reasons and socket events", &lbdv1.GetStatsResponse{
			Reasons:      []*lbdv1.Counter{{Name: "backend_decap", Packets: 9}},
			SocketEvents: []*lbdv1.EventCounter{{Name: "connect", Count: 40}},
		}, "REASON         PACKETS\nbackend_decap  9\n\nSOCKET EVENT  CALLS\nconnect       40\n"},
		{"conntrack events in the datapath's order", &lbdv1.GetStatsResponse{
			ConntrackEvents: []*lbdv1.EventCounter{{Name: "inserted", Count: 12}, {Name: "guard_skipped", Count: 3}},
		}, "CONNTRACK EVENT  COUNT\ninserted         12\nguard_skipped    3\n"},
	} {
		srv := startFake(t, &fakeDatapath{stats: tc.stats})
		if got := ok(t, srv, "stats"); got != tc.want {
			t.Errorf("%s: stats:\n%s\nwant:\n%s", tc.name, got, tc.want)
		}
	}
}

func TestConntrackList(t *testing.T) {
	t.Parallel()
	f := &fakeDatapath{
		conns: &lbdv1.ListConnectionsResponse{Truncated: true, Connections: []*lbdv1.Connection{
			{Table: "conntrack", Protocol: lbdv1.Protocol_PROTOCOL_UDP, ClientAddress: "198.51.100.7", ClientPort: 5353,
				Vip: "203.0.113.10", VipPort: 53, BackendAddress: "198.18.1.10", BackendPort: 53},
			{Table: "conntrack", Protocol: lbdv1.Protocol_PROTOCOL_TCP, ClientAddress: "2001:db8:1::7", ClientPort: 40000,
				Vip: "2001:db8::10", VipPort: 443, BackendAddress: "2001:db8::20", BackendPort: 8443},
			{Table: "nat", Protocol: lbdv1.Protocol_PROTOCOL_TCP, ClientAddress: "198.51.100.8", ClientPort: 1234,
				Vip: "203.0.113.10", VipPort: 80, BackendAddress: "198.18.1.10", BackendPort: 8080},
			// Its backend was removed: the daemon sends no backend address.
			{Table: "conntrack", Protocol: lbdv1.Protocol_PROTOCOL_TCP, ClientAddress: "198.51.100.9", ClientPort: 999,
				Vip: "203.0.113.10", VipPort: 53},
		}},
		seenAgo: []time.Duration{90 * time.Second, 26*time.Hour + 3*time.Minute, 0},
	}
	srv := startFake(t, f)

	out := ok(t, srv, "conntrack", "list", "--vip", "2001:DB8:0::10", "--client", "198.51.100.7", "--backend", "2001:db8::20", "--limit", "4")
	body, note, found := strings.Cut(out, "\n\n")
	if !found || note != "Truncated: more entries matched than the 4 shown; narrow with --vip, --client or --backend, or raise --limit.\n" {
		t.Errorf("conntrack list does not end with the truncation note:\n%s", out)
	}
	rows := table(t, body+"\n")
	want := [][]string{
		{"TABLE", "PROTO", "CLIENT", "VIP", "BACKEND", "LAST SEEN"},
		{"conntrack", "tcp", "198.51.100.9:999", "203.0.113.10:53", "-", "-"},
		{"conntrack", "udp", "198.51.100.7:5353", "203.0.113.10:53", "198.18.1.10:53", "00:01:3"},
		{"conntrack", "tcp", "[2001:db8:1::7]:40000", "[2001:db8::10]:443", "[2001:db8::20]:8443", "1d 02:03:0"},
		{"nat", "tcp", "198.51.100.8:1234", "203.0.113.10:80", "198.18.1.10:8080", "00:00:0"},
	}
	// Ages are checked to ten seconds: the run takes time.
	if len(rows) != len(want) {
		t.Fatalf("conntrack list has %d rows, want %d:\n%s", len(rows), len(want), out)
	}
	for i := range want {
		got := strings.Join(rows[i], "|")
		if w := strings.Join(want[i], "|"); got != w && (i == 0 || len(got) != len(w)+1 || !strings.HasPrefix(got, w)) {
			t.Errorf("row %d: %q, want %q", i, got, w)
		}
	}

	// In pages of at most the limit; limit and truncated for an lbd without pages (as
	// this fake answers).
	wantReq := &lbdv1.ListConnectionsRequest{Vip: "2001:db8::10", ClientAddress: "198.51.100.7", BackendAddress: "2001:db8::20", Limit: 4, PageSize: 4}
	if _, lists := f.requests(); len(lists) != 1 || !proto.Equal(lists[0], wantReq) {
		t.Errorf("requests %v, want %v", lists, wantReq)
	}
	// Without flags: no filter, the default limit.
	var resp lbdv1.ListConnectionsResponse
	parseJSON(t, ok(t, srv, "conntrack", "list", "-o", "json"), &resp)
	if _, lists := f.requests(); len(lists) != 2 || !proto.Equal(lists[1], &lbdv1.ListConnectionsRequest{Limit: 1000, PageSize: 1000}) {
		t.Errorf("requests %v, want a last one without filters and with limit 1000", lists)
	}
	if !resp.Truncated || len(resp.Connections) != 4 || resp.Connections[0].ClientPort != 999 || resp.Connections[3].Table != "nat" {
		t.Errorf("conntrack list -o json (want truncated, sorted): %v", &resp)
	}
	// A backend port, open flows only, a count, no limit.
	if got := ok(t, srv, "conntrack", "list", "--backend", "198.18.1.10:8080", "--open", "--count", "--limit", "0"); got != "4\n" {
		t.Errorf("conntrack list --count printed %q, want 4", got)
	}
	wantReq = &lbdv1.ListConnectionsRequest{BackendAddress: "198.18.1.10", BackendPort: 8080, OpenOnly: true, CountOnly: true, Limit: math.MaxUint32}
	if _, lists := f.requests(); len(lists) != 3 || !proto.Equal(lists[2], wantReq) {
		t.Errorf("requests %v, want a last one %v", lists, wantReq)
	}
}

func TestConntrackListEmpty(t *testing.T) {
	t.Parallel()
	srv := startFake(t, &fakeDatapath{conns: &lbdv1.ListConnectionsResponse{}})
	if got := ok(t, srv, "conntrack", "list", "--client", "198.51.100.1"); got != "No connections.\n" {
		t.Errorf("conntrack list with no match: %q", got)
	}
}

func TestSocketList(t *testing.T) {
	t.Parallel()
	f := &fakeDatapath{
		socks: &lbdv1.ListSocketTranslationsResponse{Truncated: true, Translations: []*lbdv1.SocketTranslation{
			{SocketCookie: 9, Protocol: lbdv1.Protocol_PROTOCOL_UDP, ServiceName: "dns", Vip: "203.0.113.10", VipPort: 53,
				BackendAddress: "198.18.1.11", BackendPort: 5353},
			{SocketCookie: 4, Protocol: lbdv1.Protocol_PROTOCOL_TCP, ServiceName: "web6", Vip: "2001:db8::10", VipPort: 443,
				BackendAddress: "2001:db8::20", BackendPort: 8443},
			{SocketCookie: 7, Protocol: lbdv1.Protocol_PROTOCOL_TCP, Vip: "203.0.113.10", VipPort: 53,
				BackendAddress: "198.18.1.10", BackendPort: 53},
		}},
		sockAgo: []time.Duration{90 * time.Second, 0, 26*time.Hour + 3*time.Minute},
	}
	srv := startFake(t, f)
	out := ok(t, srv, "socket", "list", "--vip", "2001:DB8:0::10", "--backend", "2001:db8::20", "--limit", "3")
	body, note, found := strings.Cut(out, "\n\n")
	if !found || note != "Truncated: more entries matched than the 3 shown; narrow with --vip or --backend, or raise --limit.\n" {
		t.Errorf("socket list does not end with the truncation note:\n%s", out)
	}
	rows := table(t, body+"\n")
	want := [][]string{
		{"COOKIE", "PROTO", "SERVICE", "VIP", "BACKEND", "AGE"},
		{"7", "tcp", "-", "203.0.113.10:53", "198.18.1.10:53", "1d 02:03:0"},
		{"9", "udp", "dns", "203.0.113.10:53", "198.18.1.11:5353", "00:01:3"},
		{"4", "tcp", "web6", "[2001:db8::10]:443", "[2001:db8::20]:8443", "00:00:0"},
	}
	if len(rows) != len(want) {
		t.Fatalf("socket list has %d rows, want %d:\n%s", len(rows), len(want), out)
	}
	for i := range want {
		got := strings.Join(rows[i], "|")
		if w := strings.Join(want[i], "|"); got != w && (i == 0 || len(got) != len(w)+1 || !strings.HasPrefix(got, w)) {
			t.Errorf("row %d: %q, want %q", i, got, w)
		}
	}
	f.mu.Lock()
	reqs := slices.Clone(f.sockReqs)
	f.mu.Unlock()
	wantReq := &lbdv1.ListSocketTranslationsRequest{Vip: "2001:db8::10", BackendAddress: "2001:db8::20", Limit: 3}
	if len(reqs) != 1 || !proto.Equal(reqs[0], wantReq) {
		t.Errorf("requests %v, want %v", reqs, wantReq)
	}
	if r := lbctl(t, srv, "socket", "list", "--vip", "web"); r.code != ExitUsage || !strings.Contains(r.stderr, "--vip") {
		t.Errorf("socket list --vip web: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestTrace(t *testing.T) {
	t.Parallel()
	f := &fakeDatapath{trace: &lbdv1.TraceFlowResponse{
		ServiceName: "web6", Verdict: "XDP_TX", Reason: "new flow: Maglev table (size 65537) chose backend 3",
		Backend: &lbdv1.Backend{Id: 3, Address: "2001:db8::20", Port: 8443, NodeAddress: "2001:db8::1"},
	}}
	srv := startFake(t, f)
	want := `Flow:     tcp [2001:db8:1::7]:40000 -> [2001:db8::10]:443
Service:  web6
Verdict:  XDP_TX
Backend:  [2001:db8::20]:8443 on node 2001:db8::1
Reason:   new flow: Maglev table (size 65537) chose backend 3
`
	if got := ok(t, srv, "trace", "tcp", "2001:DB8:1:0::7", "40000", "2001:db8::10", "443"); got != want {
		t.Errorf("trace:\n%s\nwant:\n%s", got, want)
	}
	wantReq := model.Flow{Protocol: lbdv1.Protocol_PROTOCOL_TCP, Src: netip.MustParseAddrPort("[2001:db8:1::7]:40000"),
		Dst: netip.MustParseAddrPort("[2001:db8::10]:443")}
	if traces, _ := f.requests(); len(traces) != 1 || !reflect.DeepEqual(traces[0], wantReq) {
		t.Errorf("requests %v, want %v", traces, wantReq)
	}

	var resp lbdv1.TraceFlowResponse
	parseJSON(t, ok(t, srv, "trace", "udp", "198.51.100.7", "0", "203.0.113.10", "65535", "-o", "json"), &resp)
	if !proto.Equal(&resp, f.trace) {
		t.Errorf("trace -o json: %v, want %v", &resp, f.trace)
	}
	wantReq = model.Flow{Protocol: lbdv1.Protocol_PROTOCOL_UDP, Src: netip.MustParseAddrPort("198.51.100.7:0"),
		Dst: netip.MustParseAddrPort("203.0.113.10:65535")}
	if traces, _ := f.requests(); len(traces) != 2 || !reflect.DeepEqual(traces[1], wantReq) {
		t.Errorf("requests %v, want %v last", traces, wantReq)
	}
}

func TestTraceNotForwarded(t *testing.T) {
	t.Parallel()
	srv := startFake(t, &fakeDatapath{trace: &lbdv1.TraceFlowResponse{Verdict: "XDP_PASS", Reason: "no service on this VIP"}})
	want := `Flow:     udp 198.51.100.7:53 -> 203.0.113.99:53
Service:  none (no service on this VIP, port and protocol)
Verdict:  XDP_PASS
Backend:  none
Reason:   no service on this VIP
`
	if got := ok(t, srv, "trace", "udp", "198.51.100.7", "53", "203.0.113.99", "53"); got != want {
		t.Errorf("trace:\n%s\nwant:\n%s", got, want)
	}
}

func TestNodeDetach(t *testing.T) {
	t.Parallel()
	f := &fakeDatapath{}
	srv := startFake(t, f)
	if !strings.Contains(ok(t, srv, "node", "get"), "Datapath:  attached\n") {
		t.Fatal("node get does not show the fake datapath attached")
	}
	const question = "Detach the datapath? This node stops forwarding, established flows included. [y/N] "
	for _, stdin := range []string{"", "\n", "n\n", "no\n", "yes please\n", "y"} {
		r := lbctlIn(t, srv, stdin, "node", "detach")
		if stdin == "y" {
			// An answer cut by the end of stdin still counts.
			if r.code != ExitOK || !strings.HasPrefix(r.stderr, question) {
				t.Errorf("stdin %q: exit %d, stderr %q", stdin, r.code, r.stderr)
			}
			continue
		}
		wantErr := question + "lbctl: detach not confirmed; nothing changed (--yes skips the question)\n"
		if !strings.HasSuffix(stdin, "\n") {
			wantErr = question + "\nlbctl: detach not confirmed; nothing changed (--yes skips the question)\n"
		}
		if r.code != ExitError || r.stdout != "" || r.stderr != wantErr {
			t.Errorf("stdin %q: exit %d, stdout %q, stderr %q; want exit 1, stderr %q", stdin, r.code, r.stdout, r.stderr, wantErr)
		}
		if c := f.calls(); c[3] != 0 {
			t.Fatalf("stdin %q detached the datapath", stdin)
		}
	}
	if c := f.calls(); c[3] != 1 {
		t.Fatalf("answer y: DetachNode called %d times", c[3])
	}

	r := lbctlIn(t, srv, "YES\n", "node", "detach")
	if r.code != ExitOK || r.stderr != question {
		t.Errorf("answer YES: exit %d, stderr %q", r.code, r.stderr)
	}
	if !strings.HasPrefix(r.stdout, "datapath detached: the node no longer forwards\n\nRoles:") || !strings.Contains(r.stdout, "Datapath:  detached\n") {
		t.Errorf("node detach printed:\n%s", r.stdout)
	}
	// --yes reads no stdin and asks nothing.
	var node lbdv1.Node
	parseJSON(t, ok(t, srv, "node", "detach", "--yes", "-o", "json"), &node)
	if node.DatapathAttached || node.Version != apitestVersion {
		t.Errorf("node detach -o json: %v", &node)
	}
	if c := f.calls(); c[3] != 3 {
		t.Errorf("DetachNode called %d times, want 3", c[3])
	}
}

// TestDatapathUsageErrors checks the arguments are validated before any request is sent.
func TestDatapathUsageErrors(t *testing.T) {
	t.Parallel()
	f := &fakeDatapath{}
	srv := startFake(t, f)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"stats", "web"}, `"lbctl stats" takes no arguments`},
		{[]string{"conntrack"}, ""},
		{[]string{"conntrack", "show"}, `unknown command "show" for "lbctl conntrack"`},
		{[]string{"conntrack", "list", "203.0.113.10"}, `"lbctl conntrack list" takes no arguments`},
		{[]string{"conntrack", "list", "--vip", "web"}, `--vip: "web" is not an IP address`},
		{[]string{"conntrack", "list", "--client", "198.51.100.7:80"}, `--client: "198.51.100.7:80" is not an IP address`},
		{[]string{"conntrack", "list", "--backend", "fe80::1%eth0"}, `--backend: "fe80::1%eth0" is not an IP address`},
		{[]string{"conntrack", "list", "--limit", "-1"}, `invalid argument "-1" for "--limit"`},
		{[]string{"trace", "tcp", "198.51.100.7", "40000", "203.0.113.10"}, "takes 5 argument(s) (PROTOCOL, SRC-ADDR, SRC-PORT, VIP, PORT), got 4"},
		{[]string{"trace", "icmp", "198.51.100.7", "40000", "203.0.113.10", "80"}, `protocol "icmp": must be one of tcp, udp, sctp`},
		{[]string{"trace", "tcp", "client", "40000", "203.0.113.10", "80"}, `source address: "client" is not an IP address`},
		{[]string{"trace", "tcp", "198.51.100.7", "65536", "203.0.113.10", "80"}, `source port: "65536" is not a port (0-65535)`},
		{[]string{"trace", "tcp", "198.51.100.7", "40000", "203.0.113.10:80", "80"}, `VIP: "203.0.113.10:80" is not an IP address`},
		{[]string{"trace", "tcp", "198.51.100.7", "40000", "203.0.113.10", "http"}, `port: "http" is not a port (0-65535)`},
		{[]string{"trace", "udp", "198.51.100.7", "40000", "2001:db8::10", "53"}, "source address 198.51.100.7 and VIP 2001:db8::10 are not of the same IP version"},
		{[]string{"node", "detach", "now"}, `"lbctl node detach" takes no arguments`},
		{[]string{"node", "detach", "--force"}, "unknown flag: --force"},
	} {
		r := lbctlIn(t, srv, "y\n", tc.args...)
		if tc.want == "" {
			// A group alone prints its help.
			if r.code != ExitOK || !strings.Contains(r.stdout, "Usage:") || !strings.Contains(r.stdout, "list") {
				t.Errorf("%v: exit %d, stdout %q, stderr %q", tc.args, r.code, r.stdout, r.stderr)
			}
			continue
		}
		first, _, _ := strings.Cut(r.stderr, "\n")
		if r.code != ExitUsage || r.stdout != "" || !strings.HasPrefix(first, "lbctl: ") || !strings.Contains(first, tc.want) ||
			!strings.Contains(r.stderr, "--help'.") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2, no stdout, stderr with %q", tc.args, r.code, r.stdout, r.stderr, tc.want)
		}
	}
	if c := f.calls(); c != [4]int{} {
		t.Errorf("usage errors sent requests (trace, list, stats, detach): %v", c)
	}
}

// TestDatapathUnimplemented runs each command against a server without a datapath.
func TestDatapathUnimplemented(t *testing.T) {
	t.Parallel()
	srv := apitest.Start(t)
	unimplemented := regexp.MustCompile(`^lbctl: \w+ needs the node's datapath, .* \(code: Unimplemented\)\n$`)
	for _, args := range [][]string{
		{"stats"},
		{"stats", "-o", "json"},
		{"conntrack", "list"},
		{"conntrack", "list", "--vip", "203.0.113.10", "-o", "yaml"},
		{"trace", "tcp", "198.51.100.7", "40000", "203.0.113.10", "80"},
		{"node", "detach", "--yes"},
	} {
		r := lbctl(t, srv, args...)
		if r.code != ExitError || r.stdout != "" || !unimplemented.MatchString(r.stderr) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 1 with code Unimplemented", args, r.code, r.stdout, r.stderr)
		}
	}
}

func TestDatapathCompletion(t *testing.T) {
	t.Parallel()
	srv := startFake(t, &fakeDatapath{})
	ok(t, srv, "service", "create", "web", "--vip", "203.0.113.10", "--port", "80")
	ok(t, srv, "service", "create", "web-tls", "--vip", "203.0.113.10", "--port", "443")
	ok(t, srv, "service", "create", "web6", "--vip", "2001:db8::10", "--port", "80")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"trace", ""}, "[tcp udp sctp]"},
		{[]string{"trace", "tcp", "198.51.100.7", "40000", ""}, "[203.0.113.10 2001:db8::10]"},
		{[]string{"trace", "tcp", "198.51.100.7", "40000", "2001", ""}, "[]"},
		{[]string{"conntrack", "list", "--vip", "203"}, "[203.0.113.10]"},
	} {
		if got := strings.Join(completions(t, srv, tc.args...), " "); "["+got+"]" != tc.want {
			t.Errorf("complete %v: [%s], want %s", tc.args, got, tc.want)
		}
	}
}

// TestNodeVerifyAndNextHops: node verify lists what the datapath repaired (or says it
// matched), and node get shows readiness, repair counts and the path toward every
// backend node.
func TestNodeVerifyAndNextHops(t *testing.T) {
	f := &fakeDatapath{
		hops: []*lbdv1.NextHop{{NodeAddress: "198.18.0.21", Reachable: true, NextHop: "198.18.0.21", Interface: "eth1",
			Source: "198.18.0.11", Neighbour: "REACHABLE", Managed: true, Reason: "on-link dev eth1"},
			{NodeAddress: "198.18.0.22", Reason: "no route to backend node 198.18.0.22"}},
	}
	srv := startFake(t, f)
	if out := ok(t, srv, "node", "verify"); out != "datapath verified: it matches the desired state\n" {
		t.Errorf("node verify with nothing to repair:\n%s", out)
	}
	f.drift = []*lbdv1.Drift{{Kind: "backend", Description: "backend 3 of service web: missing"}}
	out := ok(t, srv, "node", "verify")
	if !strings.Contains(out, "KIND") || !strings.Contains(out, "backend  backend 3 of service web: missing") {
		t.Errorf("node verify:\n%s", out)
	}
	var resp lbdv1.VerifyNodeResponse
	parseJSON(t, ok(t, srv, "node", "verify", "-o", "json"), &resp)
	if len(resp.Repaired) != 1 || resp.Repaired[0].Kind != "backend" {
		t.Errorf("node verify -o json: %v", &resp)
	}
	out = ok(t, srv, "node", "get")
	for _, want := range []string{"Ready:     yes", "Repaired:  backend 1",
		"198.18.0.21   yes        198.18.0.21  eth1       198.18.0.11  REACHABLE (managed)",
		"198.18.0.22   no         -", "no route to backend node 198.18.0.22"} {
		if !strings.Contains(out, want) {
			t.Errorf("node get lacks %q:\n%s", want, out)
		}
	}
}
