//go:build linux

package datapath

import (
	"context"
	"github.com/lbd-dev/lbd/daemon/model/modeltest"
	"net/netip"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/bpf/lbxdp"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestListConnectionsPages: 5,000 conntrack entries listed in pages of 700 come out
// once each, in order, every page but the last full; entries deleted and added between
// pages do not make an entry that stays throughout appear twice or go missing. A token
// is refused with other filters, or when lbd did not make it.
func TestListConnectionsPages(t *testing.T) {
	n := newNode(t)
	m := n.open(t, n.config(1<<16))
	svc := service(1, "web", "203.0.113.10", 80, 251, backend(1, "198.18.10.1", 8080, active), backend(2, "198.18.10.2", 8080, active))
	ctx := context.Background()
	if _, err := m.Sync(ctx, modeltest.All(svc)); err != nil {
		t.Fatal(err)
	}
	entries := ctEntries(5000, 1, 1, 2, time.Hour, 1)
	if _, err := m.lb.RestoreConntrack(entries); err != nil {
		t.Fatal(err)
	}
	key := func(c *lbdv1.Connection) string {
		return netip.AddrPortFrom(netip.MustParseAddr(c.ClientAddress), uint16(c.ClientPort)).String()
	}
	list := func(between func(page int)) (map[string]int, int) {
		seen := map[string]int{}
		req := &lbdv1.ListConnectionsRequest{Vip: "203.0.113.10", PageSize: 700}
		var last *lbdv1.Connection
		for page := 0; ; page++ {
			resp, err := m.ListConnections(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range resp.Connections {
				seen[key(c)]++
				if last != nil && compareConn(last, c) >= 0 {
					t.Fatalf("page %d: %v after %v", page, c, last)
				}
				last = c
			}
			if resp.NextPageToken == "" {
				return seen, page + 1
			}
			if len(resp.Connections) != 700 {
				t.Fatalf("page %d of %d entries, with another page after it", page, len(resp.Connections))
			}
			if between != nil {
				between(page)
			}
			req.PageToken = resp.NextPageToken
		}
	}
	seen, pages := list(nil)
	if len(seen) != 5000 || pages != 8 {
		t.Fatalf("%d entries in %d pages, want 5000 in 8", len(seen), pages)
	}
	for k, c := range seen {
		if c != 1 {
			t.Fatalf("%s listed %d times", k, c)
		}
	}

	// Between pages, delete every third entry and add as many new ones.
	gone := map[string]bool{}
	added := ctEntries(5000, 1, 1, 2, time.Hour, 2)
	seen, _ = list(func(page int) {
		var del []lbxdp.Flow
		for i := page; i < len(entries); i += 3 * 8 {
			del = append(del, entries[i].Flow)
			gone[entries[i].Flow.Src.String()] = true
		}
		if _, err := m.lb.DeleteConntrack(del); err != nil {
			t.Fatal(err)
		}
		if _, err := m.lb.AddConntrack(added[page*250 : min(len(added), (page+1)*250)]); err != nil {
			t.Fatal(err)
		}
	})
	for _, e := range entries {
		k := e.Flow.Src.String()
		if !gone[k] && seen[k] != 1 {
			t.Fatalf("%s, there throughout, listed %d times", k, seen[k])
		}
	}
	for k, c := range seen {
		if c != 1 {
			t.Fatalf("%s listed %d times", k, c)
		}
	}

	first, err := m.ListConnections(ctx, &lbdv1.ListConnectionsRequest{PageSize: 10})
	if err != nil || first.NextPageToken == "" {
		t.Fatalf("first page: %v, %v", first, err)
	}
	for _, r := range []*lbdv1.ListConnectionsRequest{
		{PageSize: 10, PageToken: first.NextPageToken, Vip: "203.0.113.10"},
		{PageSize: 10, PageToken: first.NextPageToken, OpenOnly: true},
		{PageSize: 10, PageToken: "not-a-token"},
		{PageSize: -1},
	} {
		if _, err := m.ListConnections(ctx, r); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: %v, want InvalidArgument", r, err)
		}
	}
}

// compareConn orders connections as ListConnections' pages do.
func compareConn(a, b *lbdv1.Connection) int {
	return connKeyOf(a).compare(connKeyOf(b))
}

func connKeyOf(c *lbdv1.Connection) connKey {
	ap := func(addr string, port uint32) netip.AddrPort {
		a, _ := netip.ParseAddr(addr) // "" for a backend that is gone: the zero address
		return netip.AddrPortFrom(a, uint16(port))
	}
	proto, _ := protoNum(c.Protocol)
	return connKey{Proto: proto, Client: ap(c.ClientAddress, c.ClientPort), VIP: ap(c.Vip, c.VipPort), Backend: ap(c.BackendAddress, c.BackendPort)}
}

// BenchmarkListConnectionsPage lists one page of 10,000 entries from a conntrack table of
// 1M (the page after the first, so the token is decoded and compared on every entry),
// reporting ns per page and, as the baseline measured in the same run, the same table
// counted (count_only: the same pass, nothing kept): page-ratio is their quotient.
func BenchmarkListConnectionsPage(b *testing.B) {
	n := newNode(b)
	m := n.open(b, n.config(1<<21))
	entries := ctEntries(1<<20, 1, 1, 2, time.Hour, 5)
	for i := range entries {
		entries[i].Flow.Src = netip4(100, byte(64+i>>16), byte(i>>8), byte(i), entries[i].Flow.Src.Port())
	}
	if _, err := m.lb.RestoreConntrack(entries); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	first, err := m.ListConnections(ctx, &lbdv1.ListConnectionsRequest{PageSize: MaxConnectionPage})
	if err != nil || first.NextPageToken == "" {
		b.Fatalf("first page: %v", err)
	}
	var page, count time.Duration
	for b.Loop() {
		start := time.Now()
		resp, err := m.ListConnections(ctx, &lbdv1.ListConnectionsRequest{PageSize: MaxConnectionPage, PageToken: first.NextPageToken})
		if err != nil || len(resp.Connections) != MaxConnectionPage {
			b.Fatalf("page: %d entries, %v", len(resp.GetConnections()), err)
		}
		page += time.Since(start)
		start = time.Now()
		if resp, err := m.ListConnections(ctx, &lbdv1.ListConnectionsRequest{CountOnly: true}); err != nil || resp.MatchedCount != 1<<20 {
			b.Fatalf("count: %d, %v", resp.GetMatchedCount(), err)
		}
		count += time.Since(start)
	}
	b.ReportMetric(float64(page.Nanoseconds())/float64(b.N), "ns/page")
	b.ReportMetric(float64(count.Nanoseconds())/float64(b.N), "count-ns/pass")
	b.ReportMetric(float64(page)/float64(count), "page-ratio")
}
