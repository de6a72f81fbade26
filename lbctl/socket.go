package lbctl

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/spf13/cobra"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

func (a *app) socketCommand() *cobra.Command {
	return group("socket", "Inspect socket-level load balancing of local processes",
		a.socketListCommand(),
	)
}

func (a *app) socketListCommand() *cobra.Command {
	var vip, backend string
	var limit uint32
	cmd := &cobra.Command{
		Use:   "list [flags]",
		Short: "List local sockets translated from a service to a backend",
		Long: `List the sockets of local processes whose connect() or UDP send to a service was
translated to a backend by socket-level load balancing (datapath.socket_lb): the
socket's cookie, the service as the application addressed it (what getpeername() and
recvmsg() return) and the backend its packets really go to. A connected socket is
listed until it closes; an unconnected UDP socket once per backend it sent to, until
the table evicts it. The counters are in "lbctl stats" (SOCKET EVENT).`,
		Example: "  lbctl socket list\n  lbctl socket list --vip 203.0.113.10 --limit 20",
		Args:    exactArgs(),
	}
	fs := cmd.Flags()
	fs.StringVar(&vip, "vip", "", "only sockets addressed to this VIP")
	fs.StringVar(&backend, "backend", "", "only sockets translated to this backend address")
	fs.Uint32Var(&limit, "limit", defaultConnectionLimit, "at most this many entries")
	_ = cmd.RegisterFlagCompletionFunc("vip", a.completeFlag(a.completeVIPs))
	cmd.RunE = a.run(func(ctx context.Context, _ *cobra.Command, _ []string) error {
		if limit == 0 {
			return usageErrorf("--limit must be positive")
		}
		req := &lbdv1.ListSocketTranslationsRequest{Limit: limit}
		if err := setAddrFilters(addrFilter{"vip", vip, &req.Vip}, addrFilter{"backend", backend, &req.BackendAddress}); err != nil {
			return err
		}
		lb, err := a.lb()
		if err != nil {
			return err
		}
		resp, err := lb.ListSocketTranslations(ctx, req)
		if err != nil {
			return err
		}
		slices.SortFunc(resp.Translations, func(x, y *lbdv1.SocketTranslation) int {
			return cmp.Or(compareAddr(x.Vip, y.Vip), cmp.Compare(x.VipPort, y.VipPort),
				cmp.Compare(x.Protocol, y.Protocol), cmp.Compare(x.SocketCookie, y.SocketCookie))
		})
		return a.print(resp, func(w io.Writer) { a.writeSocketTranslations(w, resp) })
	})
	return cmd
}

func (a *app) writeSocketTranslations(w io.Writer, resp *lbdv1.ListSocketTranslationsResponse) {
	if len(resp.Translations) == 0 {
		fmt.Fprintln(w, "No translated sockets.")
		return
	}
	now := a.now()
	t := newTable(w)
	row(t, "COOKIE", "PROTO", "SERVICE", "VIP", "BACKEND", "AGE")
	for _, s := range resp.Translations {
		age := "-"
		if s.CreateTime != nil {
			age = formatAge(now.Sub(s.CreateTime.AsTime()))
		}
		row(t, fmt.Sprint(s.SocketCookie), label(s.Protocol, "-"), dash(s.ServiceName),
			formatEndpoint(s.Vip, s.VipPort), formatEndpoint(s.BackendAddress, s.BackendPort), age)
	}
	t.Flush()
	if resp.Truncated {
		fmt.Fprintf(w, "\nTruncated: more entries matched than the %d shown; narrow with --vip or --backend, or raise --limit.\n", len(resp.Translations))
	}
}
