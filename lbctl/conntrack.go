package lbctl

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"net/netip"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// defaultConnectionLimit is the API's own default (a limit of 0 means it), spelled out so
// that the help shows it.
const defaultConnectionLimit = 1000

func (a *app) conntrackCommand() *cobra.Command {
	return group("conntrack", "Inspect the datapath's connection tables",
		a.conntrackListCommand(),
	)
}

func (a *app) conntrackListCommand() *cobra.Command {
	var vip, client, backend string
	var limit uint32
	var count, open bool
	cmd := &cobra.Command{
		Use:   "list [flags]",
		Short: "List conntrack (LB node) and NAT (backend node) entries",
		Long: `List the flows the datapath tracks: conntrack entries on an LB node (which backend
each client flow is pinned to) and NAT entries on a backend node (which VIP the backend's
replies are sent from). The filters combine with AND. --limit 0 lists every entry
(fetched in pages of 10,000: a flow that stays while the list runs is listed once);
--count prints only how many match; --open leaves out flows that have ended (FIN or
RST seen, or past their timeout and not collected yet).`,
		Example: "  lbctl conntrack list --vip 203.0.113.10\n  lbctl conntrack list --client 2001:db8::7 --limit 10\n" +
			"  lbctl conntrack list --backend 198.18.1.10:8080 --open --count",
		Args: exactArgs(),
	}
	fs := cmd.Flags()
	fs.StringVar(&vip, "vip", "", "only flows to this VIP")
	fs.StringVar(&client, "client", "", "only flows from this client address")
	fs.StringVar(&backend, "backend", "", "only flows to this backend: ADDR or ADDR:PORT ([ADDR]:PORT for IPv6)")
	fs.Uint32Var(&limit, "limit", defaultConnectionLimit, "at most this many entries; 0 lists them all")
	fs.BoolVar(&count, "count", false, "print only the number of matching entries")
	fs.BoolVar(&open, "open", false, "only flows that have not ended (no FIN or RST seen, not past their timeout)")
	// The flag was just defined on cmd, so registration cannot fail.
	_ = cmd.RegisterFlagCompletionFunc("vip", a.completeFlag(a.completeVIPs))
	cmd.RunE = a.run(func(ctx context.Context, _ *cobra.Command, _ []string) error {
		// An lbd without pages answers with limit (0 is its default of 1,000) and
		// truncated.
		req := &lbdv1.ListConnectionsRequest{Limit: limit, CountOnly: count, OpenOnly: open}
		if limit == 0 {
			req.Limit = math.MaxUint32
		}
		if ap, err := netip.ParseAddrPort(backend); err == nil {
			backend, req.BackendPort = ap.Addr().String(), uint32(ap.Port())
		}
		err := setAddrFilters(
			addrFilter{"vip", vip, &req.Vip},
			addrFilter{"client", client, &req.ClientAddress},
			addrFilter{"backend", backend, &req.BackendAddress},
		)
		if err != nil {
			return err
		}
		lb, err := a.lb()
		if err != nil {
			return err
		}
		resp, err := listConnections(ctx, lb, req, limit)
		if err != nil {
			return err
		}
		if count {
			return a.print(resp, func(w io.Writer) { fmt.Fprintln(w, resp.MatchedCount) })
		}
		sortConnections(resp.Connections)
		return a.print(resp, func(w io.Writer) { a.writeConnections(w, resp) })
	})
	return cmd
}

// connectionPage is how many entries lbctl asks for at once: the API's largest page.
const connectionPage = 10000

// listConnections lists the entries req selects in pages, following next_page_token
// until limit entries (0: every one); Truncated says that more matched. With
// count_only, one call counts them.
func listConnections(ctx context.Context, lb lbdv1.LoadBalancerServiceClient, req *lbdv1.ListConnectionsRequest, limit uint32) (*lbdv1.ListConnectionsResponse, error) {
	if req.CountOnly {
		return lb.ListConnections(ctx, req)
	}
	out := &lbdv1.ListConnectionsResponse{}
	for {
		req.PageSize = connectionPage
		if limit > 0 {
			req.PageSize = int32(min(uint32(connectionPage), limit-uint32(len(out.Connections))))
		}
		resp, err := lb.ListConnections(ctx, req)
		if err != nil {
			return nil, err
		}
		out.Connections = append(out.Connections, resp.Connections...)
		if resp.NextPageToken == "" {
			out.Truncated = resp.Truncated
			return out, nil
		}
		if limit > 0 && uint32(len(out.Connections)) >= limit {
			out.Truncated = true
			return out, nil
		}
		req.PageToken = resp.NextPageToken
	}
}

// addrFilter is an address flag (--name) whose value goes into a request field.
type addrFilter struct {
	name, value string
	target      *string
}

// setAddrFilters checks the address flags that are set and writes them into their
// request fields. The server compares filters with its own text form of each address,
// so they are sent in canonical form: 2001:DB8::0:1 finds 2001:db8::1.
func setAddrFilters(filters ...addrFilter) error {
	for _, f := range filters {
		if f.value == "" {
			continue
		}
		addr, err := parseAddr(f.value)
		if err != nil {
			return usageErrorf("--%s: %v", f.name, err)
		}
		*f.target = addr.String()
	}
	return nil
}

// parseAddr parses an IP address without a zone (the datapath knows no zones).
func parseAddr(s string) (netip.Addr, error) {
	addr, err := netip.ParseAddr(s)
	if err != nil || addr.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%q is not an IP address", s)
	}
	return addr, nil
}

// sortConnections groups entries by table and VIP, then orders them by client.
func sortConnections(cs []*lbdv1.Connection) {
	slices.SortFunc(cs, func(x, y *lbdv1.Connection) int {
		return cmp.Or(
			strings.Compare(x.Table, y.Table),
			compareAddr(x.Vip, y.Vip), cmp.Compare(x.VipPort, y.VipPort),
			cmp.Compare(x.Protocol, y.Protocol),
			compareAddr(x.ClientAddress, y.ClientAddress), cmp.Compare(x.ClientPort, y.ClientPort),
		)
	})
}

func (a *app) writeConnections(w io.Writer, resp *lbdv1.ListConnectionsResponse) {
	if len(resp.Connections) == 0 {
		fmt.Fprintln(w, "No connections.")
		return
	}
	now := a.now()
	t := newTable(w)
	row(t, "TABLE", "PROTO", "CLIENT", "VIP", "BACKEND", "LAST SEEN")
	for _, c := range resp.Connections {
		// A conntrack entry whose backend has since been removed has no backend address.
		be := "-"
		if c.BackendAddress != "" {
			be = formatEndpoint(c.BackendAddress, c.BackendPort)
		}
		seen := "-"
		if c.LastSeenTime != nil {
			seen = formatAge(now.Sub(c.LastSeenTime.AsTime()))
		}
		row(t, dash(c.Table), label(c.Protocol, "-"), formatEndpoint(c.ClientAddress, c.ClientPort),
			formatEndpoint(c.Vip, c.VipPort), be, seen)
	}
	t.Flush()
	if resp.Truncated {
		fmt.Fprintf(w, "\nTruncated: more entries matched than the %d shown; narrow with --vip, --client or --backend, or raise --limit.\n", len(resp.Connections))
	}
}

// completeFlag completes a flag's value with c, which is given no arguments.
func (a *app) completeFlag(c completer) cobra.CompletionFunc {
	complete := a.completeArgs(c)
	return func(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return complete(cmd, nil, toComplete)
	}
}

// completeVIPs proposes the VIPs of the configured services, each once.
func (a *app) completeVIPs(ctx context.Context, _ []string) []string {
	lb, err := a.lb()
	if err != nil {
		return nil
	}
	resp, err := lb.ListServices(ctx, &lbdv1.ListServicesRequest{})
	if err != nil {
		return nil
	}
	var vips []string
	for _, s := range resp.Services {
		vips = append(vips, s.Vip)
	}
	slices.SortFunc(vips, compareAddr)
	return slices.Compact(vips)
}
