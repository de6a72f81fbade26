package lbctl

import (
	"context"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/lbd-dev/lbd/daemon/api"
	"github.com/lbd-dev/lbd/daemon/apitest"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// fakeBGP stands in for the node's speaker behind the BGP RPCs.
type fakeBGP struct{ routes []*lbdv1.BgpRoute }

func (f *fakeBGP) Peers(context.Context) ([]*lbdv1.BgpPeer, error)   { return nil, nil }
func (f *fakeBGP) Routes(context.Context) ([]*lbdv1.BgpRoute, error) { return f.routes, nil }
func (f *fakeBGP) Static(netip.Addr) bool                            { return false }

func TestBGPRoutes(t *testing.T) {
	t.Parallel()
	srv := apitest.StartWithOptions(t, store.DefaultLimits(), api.Options{BGP: &fakeBGP{routes: []*lbdv1.BgpRoute{
		{Prefix: "2001:db8::10/128", ServiceName: "web6"},
		{Prefix: "203.0.113.10/32", NextHop: "198.18.0.11", Communities: []string{"65000:100", "no-export"}, Med: 10, ServiceName: "web,web-tls"},
		{Prefix: "203.0.113.9/32", ServiceName: "dns"},
	}}}).Addr
	out := ok(t, srv, "bgp", "routes")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[1], "203.0.113.9/32") || !strings.HasPrefix(lines[2], "203.0.113.10/32") || !strings.HasPrefix(lines[3], "2001:db8::10/128") {
		t.Fatalf("routes not sorted by address:\n%s", out)
	}
	if !strings.Contains(lines[2], "65000:100 no-export") || !strings.Contains(lines[2], "198.18.0.11") {
		t.Errorf("route row lacks its attributes: %q", lines[2])
	}
	var resp struct {
		Routes []map[string]any `json:"routes"`
	}
	if err := json.Unmarshal([]byte(ok(t, srv, "bgp", "routes", "-o", "json")), &resp); err != nil || len(resp.Routes) != 3 {
		t.Fatalf("json: %v %v", resp, err)
	}

	plain := apitest.Start(t)
	// Like bgp peers, an answer: no route, and why.
	if out := ok(t, plain, "bgp", "routes"); out != "No routes: this lbd runs no BGP speaker (no bgp section in its configuration).\n" {
		t.Errorf("without a speaker: %q", out)
	}
}
