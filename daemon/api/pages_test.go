package api_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/lbd-dev/lbd/daemon/api"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// manyServices returns n services named svc-0000..., on VIPs and ports that differ.
func manyServices(n int) []*lbdv1.Service {
	out := make([]*lbdv1.Service, n)
	for i := range n {
		out[i] = &lbdv1.Service{Name: fmt.Sprintf("svc-%04d", i), Vip: fmt.Sprintf("203.0.113.%d", i%250+1),
			Port: uint32(1000 + i/250), Protocol: lbdv1.Protocol_PROTOCOL_TCP,
			Backends: []*lbdv1.Backend{{Address: fmt.Sprintf("198.18.1.%d", i%250+1), Port: 8080}}}
	}
	return out
}

// listAll follows next_page_token from the first page to the last.
func listAll(t *testing.T, c *clients, req *lbdv1.ListServicesRequest) (names []string, pages int) {
	t.Helper()
	for {
		resp, err := c.lb.ListServices(ctx(t), req)
		if err != nil {
			t.Fatalf("list (page %d): %v", pages+1, err)
		}
		pages++
		for _, s := range resp.Services {
			names = append(names, s.Name)
		}
		if resp.NextPageToken == "" {
			return names, pages
		}
		req.PageToken = resp.NextPageToken
	}
}

// TestListServicesPages: pages of page_size services, in name order, that together are
// the whole list (of the owner, when one is given); page_size 0 returns everything, as
// before pagination; sizes above the maximum are lowered to it.
func TestListServicesPages(t *testing.T) {
	lim := store.DefaultLimits()
	c := startWith(t, lim)
	if _, err := c.lb.ApplyServices(ctx(t), &lbdv1.ApplyServicesRequest{Owner: "k8s", Services: manyServices(2300)}); err != nil {
		t.Fatal(err)
	}
	other := &lbdv1.Service{Name: "svc-1000x", Vip: "203.0.113.254", Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP}
	if _, err := c.lb.CreateService(ctx(t), &lbdv1.CreateServiceRequest{Service: other}); err != nil {
		t.Fatal(err)
	}
	all, err := c.lb.ListServices(ctx(t), &lbdv1.ListServicesRequest{})
	if err != nil || len(all.Services) != 2301 || all.NextPageToken != "" {
		t.Fatalf("page_size 0: %d services, next_page_token %q, %v; want all 2301 at once", len(all.GetServices()), all.GetNextPageToken(), err)
	}
	var want []string
	for _, s := range all.Services {
		want = append(want, s.Name)
	}
	for _, tc := range []struct {
		size, pages int
		owner       string
	}{{7, 329, ""}, {500, 5, ""}, {1000, 3, ""}, {5 * api.MaxPageSize, (2301 + api.MaxPageSize - 1) / api.MaxPageSize, ""}, {500, 5, "k8s"}, {10, 0, "nobody"}} {
		t.Run(fmt.Sprintf("size %d owner %q", tc.size, tc.owner), func(t *testing.T) {
			got, pages := listAll(t, c, &lbdv1.ListServicesRequest{PageSize: int32(tc.size), Owner: tc.owner})
			exp := want
			switch tc.owner {
			case "k8s":
				exp = slicesWithout(want, other.Name)
			case "nobody":
				exp, tc.pages = nil, 1
			}
			if strings.Join(got, ",") != strings.Join(exp, ",") {
				t.Fatalf("pages hold %d services, want the %d of one list in the same order", len(got), len(exp))
			}
			if pages != tc.pages {
				t.Errorf("%d pages, want %d", pages, tc.pages)
			}
		})
	}
}

func slicesWithout(s []string, drop string) []string {
	var out []string
	for _, x := range s {
		if x != drop {
			out = append(out, x)
		}
	}
	return out
}

// TestListServicesPageErrors: a bad page size or token is INVALID_ARGUMENT naming the
// field.
func TestListServicesPageErrors(t *testing.T) {
	c := start(t)
	if _, err := c.lb.ApplyServices(ctx(t), &lbdv1.ApplyServicesRequest{Owner: "k8s", Services: manyServices(5)}); err != nil {
		t.Fatal(err)
	}
	first, err := c.lb.ListServices(ctx(t), &lbdv1.ListServicesRequest{Owner: "k8s", PageSize: 2})
	if err != nil || first.NextPageToken == "" {
		t.Fatalf("first page: %v, %v", first, err)
	}
	for name, tc := range map[string]struct {
		req   *lbdv1.ListServicesRequest
		field string
	}{
		"negative size":    {&lbdv1.ListServicesRequest{PageSize: -1}, "page_size: "},
		"made-up token":    {&lbdv1.ListServicesRequest{PageSize: 2, PageToken: "svc-0001"}, "page_token: "},
		"other owner":      {&lbdv1.ListServicesRequest{PageSize: 2, PageToken: first.NextPageToken, Owner: "x"}, "page_token: "},
		"owner left out":   {&lbdv1.ListServicesRequest{PageSize: 2, PageToken: first.NextPageToken}, "page_token: "},
		"not base64 token": {&lbdv1.ListServicesRequest{PageToken: "!!"}, "page_token: "},
	} {
		_, err := c.lb.ListServices(ctx(t), tc.req)
		if status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(status.Convert(err).Message(), tc.field) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT starting %q", name, err, tc.field)
		}
	}
}
