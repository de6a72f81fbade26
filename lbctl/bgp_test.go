package lbctl

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lbd-dev/lbd/daemon/apitest"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

func TestBgpPeerCommands(t *testing.T) {
	t.Parallel()
	srv := apitest.Start(t)
	if out := ok(t, srv, "bgp", "peer", "add", "198.18.0.10", "--as", "65010"); out != "BGP peer 198.18.0.10 (AS 65010) added\n" {
		t.Errorf("peer add printed %q", out)
	}
	r := lbctlIn(t, srv, "s3cret\n", "bgp", "peer", "add", "198.18.0.9", "--as", "65009", "--password-stdin",
		"--hold-time", "9s", "--keepalive", "3s", "--port", "1179", "-o", "json")
	if r.code != ExitOK {
		t.Fatalf("peer add --password-stdin: exit %d, stderr %q", r.code, r.stderr)
	}
	var peer lbdv1.BgpPeer
	parseJSON(t, r.stdout, &peer)
	if peer.Address != "198.18.0.9" || peer.PeerAs != 65009 || peer.Port != 1179 || peer.HoldTime.AsDuration() != 9*time.Second ||
		peer.KeepaliveInterval.AsDuration() != 3*time.Second || peer.Password != "" {
		t.Errorf("peer add -o json printed %v (the password must never come back)", &peer)
	}
	ok(t, srv, "bgp", "peer", "add", "2001:db8::1", "--as", "65001")

	rows := table(t, ok(t, srv, "bgp", "peers"))
	want := [][]string{
		{"PEER", "AS", "UP/DOWN", "STATE", "#RECEIVED", "#ACCEPTED", "#ADVERTISED", "REASON"},
		{"198.18.0.9", "65009"},
		{"198.18.0.10", "65010"},
		{"2001:db8::1", "65001"},
	}
	if len(rows) != len(want) {
		t.Fatalf("bgp peers: %v", rows)
	}
	for i, w := range want {
		if len(rows[i]) < len(w) || fmt.Sprint(rows[i][:len(w)]) != fmt.Sprint(w) {
			t.Errorf("bgp peers row %d = %v, want prefix %v", i, rows[i], w)
		}
	}
	var list lbdv1.ListBgpPeersResponse
	parseYAML(t, ok(t, srv, "bgp", "peers", "-o", "yaml"), &list)
	if len(list.Peers) != 3 || list.Peers[0].Address != "198.18.0.9" || list.Peers[0].GetStatus().GetState() == 0 {
		t.Errorf("bgp peers -o yaml: %v", &list)
	}

	if out := ok(t, srv, "bgp", "peer", "delete", "198.18.0.10"); out != "BGP peer 198.18.0.10 deleted\n" {
		t.Errorf("peer delete printed %q", out)
	}
	parseJSON(t, ok(t, srv, "bgp", "peers", "-o", "json"), &list)
	if len(list.Peers) != 2 {
		t.Errorf("after delete: %v", &list)
	}
	r = lbctl(t, srv, "bgp", "peer", "delete", "198.18.0.10")
	if r.code != ExitError || r.stdout != "" || !strings.HasSuffix(r.stderr, "(code: NotFound)\n") {
		t.Errorf("second delete: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// TestPeerTable checks the session columns, which a server without a BGP speaker leaves
// empty.
func TestPeerTable(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	a := &app{now: func() time.Time { return now }}
	var b strings.Builder
	a.writePeerTable(&b, []*lbdv1.BgpPeer{
		{Address: "198.18.0.1", PeerAs: 65000, Status: &lbdv1.BgpPeerStatus{
			State: lbdv1.BgpSessionState_BGP_SESSION_STATE_ESTABLISHED, SinceTime: timestamppb.New(now.Add(-(26*time.Hour + 3*time.Minute + 4*time.Second))),
			ReceivedRoutes: 3, AcceptedRoutes: 2, AdvertisedRoutes: 5,
		}},
		{Address: "198.18.0.2", PeerAs: 4200000000, Status: &lbdv1.BgpPeerStatus{
			State: lbdv1.BgpSessionState_BGP_SESSION_STATE_OPENSENT, SinceTime: timestamppb.New(now.Add(-90 * time.Second)),
			Reason: "waiting for OPEN",
		}},
		{Address: "198.18.0.3", PeerAs: 65000},
	})
	want := `PEER        AS          UP/DOWN      STATE        #RECEIVED  #ACCEPTED  #ADVERTISED  REASON
198.18.0.1  65000       1d 02:03:04  established  3          2          5            -
198.18.0.2  4200000000  00:01:30     opensent     0          0          0            waiting for OPEN
198.18.0.3  65000       never        unknown      0          0          0            -
`
	if b.String() != want {
		t.Errorf("peer table:\n%s\nwant:\n%s", b.String(), want)
	}
}
