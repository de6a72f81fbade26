package lbctl

import (
	"context"
	"strings"

	"github.com/spf13/cobra"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// completer proposes values for one positional argument, given the arguments before it.
// It asks the server; on any error it proposes nothing (a shell cannot show errors).
type completer func(ctx context.Context, args []string) []string

// completeArgs completes positional argument i with cs[i].
func (a *app) completeArgs(cs ...completer) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) >= len(cs) {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		// Flags are parsed but not validated during completion.
		timeout := a.opts.timeout
		if timeout <= 0 {
			timeout = defaultTimeout
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
		defer cancel()
		var out []cobra.Completion
		for _, v := range cs[len(args)](ctx, args) {
			if strings.HasPrefix(v, toComplete) {
				out = append(out, v)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

func (a *app) completeServices(ctx context.Context, _ []string) []string {
	lb, err := a.lb()
	if err != nil {
		return nil
	}
	resp, err := lb.ListServices(ctx, &lbdv1.ListServicesRequest{})
	if err != nil {
		return nil
	}
	names := make([]string, 0, len(resp.Services))
	for _, s := range resp.Services {
		names = append(names, s.Name)
	}
	return names
}

func (a *app) completeBackends(ctx context.Context, args []string) []string {
	lb, err := a.lb()
	if err != nil {
		return nil
	}
	resp, err := lb.ListBackends(ctx, &lbdv1.ListBackendsRequest{ServiceName: args[0]})
	if err != nil {
		return nil
	}
	sortBackends(resp.Backends)
	eps := make([]string, 0, len(resp.Backends))
	for _, b := range resp.Backends {
		eps = append(eps, formatEndpoint(b.Address, b.Port))
	}
	return eps
}

func (a *app) completePeers(ctx context.Context, _ []string) []string {
	bc, err := a.bgp()
	if err != nil {
		return nil
	}
	resp, err := bc.ListBgpPeers(ctx, &lbdv1.ListBgpPeersRequest{})
	if err != nil {
		return nil
	}
	sortPeers(resp.Peers)
	addrs := make([]string, 0, len(resp.Peers))
	for _, p := range resp.Peers {
		addrs = append(addrs, p.Address)
	}
	return addrs
}
