//go:build linux

package datapath

import (
	"cmp"
	"container/heap"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// MaxConnectionPage is the most entries one page of ListConnections holds.
const MaxConnectionPage = 10000

// Tables of connKey, in listing order.
const (
	tableConntrack = 0
	tableNAT       = 1
)

// connKey orders the entries of ListConnections' pages: unique per entry (a conntrack
// entry by protocol, client and VIP; a NAT entry by protocol, client and backend).
type connKey struct {
	Table   uint8          `json:"t"`
	Proto   uint8          `json:"p"`
	Client  netip.AddrPort `json:"c"`
	VIP     netip.AddrPort `json:"v"`
	Backend netip.AddrPort `json:"b"`
}

func compareAddrPort(a, b netip.AddrPort) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Port(), b.Port()))
}

func (k connKey) compare(o connKey) int {
	return cmp.Or(cmp.Compare(k.Table, o.Table), cmp.Compare(k.Proto, o.Proto), compareAddrPort(k.Client, o.Client),
		compareAddrPort(k.VIP, o.VIP), compareAddrPort(k.Backend, o.Backend))
}

// connPageToken is where a page ended, and for which filters (AIP-158: opaque to clients).
type connPageToken struct {
	Filters string  `json:"f"`
	After   connKey `json:"a"`
}

// connFilters is the filters of a request as its page tokens record them.
func connFilters(r *lbdv1.ListConnectionsRequest) string {
	return fmt.Sprintf("%s|%s|%s|%d|%v", r.GetVip(), r.GetClientAddress(), r.GetBackendAddress(), r.GetBackendPort(), r.GetOpenOnly())
}

func (t connPageToken) encode() string {
	b, _ := json.Marshal(t) // strings and numbers always marshal
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeConnPageToken(r *lbdv1.ListConnectionsRequest) (*connKey, error) {
	if r.GetPageToken() == "" {
		return nil, nil
	}
	var t connPageToken
	b, err := base64.RawURLEncoding.DecodeString(r.GetPageToken())
	if err == nil {
		err = json.Unmarshal(b, &t)
	}
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "page_token: %q is not a token lbd returned as next_page_token", r.GetPageToken())
	}
	if t.Filters != connFilters(r) {
		return nil, status.Error(codes.InvalidArgument, "page_token: it continues a list with other filters (vip, client_address, backend_address, backend_port, open_only)")
	}
	return &t.After, nil
}

// connPage collects the page_size first entries after a key: a bounded heap holding
// the smallest keys seen, so a page costs one pass over the tables and memory for one
// page.
type connPage struct {
	after *connKey
	size  int
	h     connHeap
}

type pageEntry struct {
	key   connKey
	build func() *lbdv1.Connection
}

// connHeap is a max-heap by key: its root is the entry to drop first.
type connHeap []pageEntry

func (h connHeap) Len() int           { return len(h) }
func (h connHeap) Less(i, j int) bool { return h[i].key.compare(h[j].key) > 0 }
func (h connHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *connHeap) Push(x any)        { *h = append(*h, x.(pageEntry)) }
func (h *connHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// offer considers an entry for the page; one more than the page is kept, to know
// whether another page follows.
func (p *connPage) offer(k connKey, build func() *lbdv1.Connection) {
	if p.after != nil && k.compare(*p.after) <= 0 {
		return
	}
	if len(p.h) == p.size+1 {
		if k.compare(p.h[0].key) >= 0 {
			return
		}
		heap.Pop(&p.h)
	}
	heap.Push(&p.h, pageEntry{key: k, build: build})
}

// fill writes the page into resp, with the token of the next one if more entries follow.
func (p *connPage) fill(resp *lbdv1.ListConnectionsResponse, filters string) {
	es := []pageEntry(p.h)
	slices.SortFunc(es, func(a, b pageEntry) int { return a.key.compare(b.key) })
	if len(es) > p.size {
		es = es[:p.size]
		resp.NextPageToken = connPageToken{Filters: filters, After: es[len(es)-1].key}.encode()
	}
	for _, e := range es {
		resp.Connections = append(resp.Connections, e.build())
	}
}
