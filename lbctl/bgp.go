package lbctl

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

func (a *app) bgpCommand() *cobra.Command {
	return group("bgp", "Show and manage the BGP peers that VIPs are advertised to",
		a.bgpPeersCommand(),
		a.bgpRoutesCommand(),
		group("peer", "Add and delete BGP peers",
			a.bgpPeerAddCommand(),
			a.bgpPeerDeleteCommand(),
		),
	)
}

func (a *app) bgpPeersCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "peers",
		Short: "List BGP peers and their sessions, sorted by address",
		Long: `List BGP peers and their sessions, sorted by address. With -w, then print a peer
again whenever its session changes state (or the peer is added, changed or deleted),
until interrupted: in JSON, one WatchBgpPeersResponse per line; in YAML, one document
each.`,
		Example: "  lbctl bgp peers\n  lbctl bgp peers -w",
		Args:    exactArgs(),
		RunE: a.run(func(ctx context.Context, _ *cobra.Command, _ []string) error {
			if a.watching {
				return a.bgpPeersWatch(ctx)
			}
			bc, err := a.bgp()
			if err != nil {
				return err
			}
			resp, err := bc.ListBgpPeers(ctx, &lbdv1.ListBgpPeersRequest{})
			if err != nil {
				return err
			}
			sortPeers(resp.Peers)
			return a.print(resp, func(w io.Writer) { a.writePeerTable(w, resp.Peers) })
		}),
	}
	a.addWatchFlag(cmd)
	return cmd
}

func (a *app) bgpRoutesCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "routes",
		Short: "List the VIP routes this node advertises, sorted by prefix",
		Args:  exactArgs(),
		RunE: a.run(func(ctx context.Context, _ *cobra.Command, _ []string) error {
			bc, err := a.bgp()
			if err != nil {
				return err
			}
			resp, err := bc.ListBgpRoutes(ctx, &lbdv1.ListBgpRoutesRequest{})
			if err != nil {
				return err
			}
			slices.SortFunc(resp.Routes, func(x, y *lbdv1.BgpRoute) int {
				px, ex := netip.ParsePrefix(x.Prefix)
				py, ey := netip.ParsePrefix(y.Prefix)
				if ex != nil || ey != nil {
					return strings.Compare(x.Prefix, y.Prefix)
				}
				if c := px.Addr().Compare(py.Addr()); c != 0 {
					return c
				}
				return px.Bits() - py.Bits()
			})
			return a.print(resp, func(w io.Writer) {
				if resp.NoSpeaker {
					fmt.Fprintln(w, "No routes: this lbd runs no BGP speaker (no bgp section in its configuration).")
					return
				}
				t := newTable(w)
				row(t, "PREFIX", "NEXT HOP", "COMMUNITIES", "LARGE COMMUNITIES", "MED", "SERVICES")
				for _, r := range resp.Routes {
					row(t, r.Prefix, dash(r.NextHop), dash(strings.Join(r.Communities, " ")),
						dash(strings.Join(r.LargeCommunities, " ")), r.Med, dash(r.ServiceName))
				}
				t.Flush()
			})
		}),
	}
}

// writePeerTable writes the columns of gobgp's "neighbor" table, plus why a session is
// not up. UP/DOWN is how long the session has been in its current up or down state.
func (a *app) writePeerTable(w io.Writer, ps []*lbdv1.BgpPeer) {
	t := newTable(w)
	row(t, peerHeader...)
	for _, p := range ps {
		row(t, a.peerCells(p)...)
	}
	t.Flush()
}

var peerHeader = []any{"PEER", "AS", "UP/DOWN", "STATE", "#RECEIVED", "#ACCEPTED", "#ADVERTISED", "REASON"}

// peerCells is a peer's row of the peer table.
func (a *app) peerCells(p *lbdv1.BgpPeer) []any {
	st := p.GetStatus()
	since := "never"
	if st.GetSinceTime() != nil {
		since = formatAge(a.now().Sub(st.GetSinceTime().AsTime()))
	}
	return []any{p.Address, p.PeerAs, since, label(st.GetState(), "unknown"),
		st.GetReceivedRoutes(), st.GetAcceptedRoutes(), st.GetAdvertisedRoutes(), dash(st.GetReason())}
}

func (a *app) bgpPeerAddCommand() *cobra.Command {
	var (
		peerAS                   uint32
		port                     uint16
		passwordStdin            bool
		holdTime, keepalive, grt time.Duration
		multihopTTL              uint32
		gracefulRestart          bool
	)
	cmd := &cobra.Command{
		Use:     "add ADDRESS --as AS [flags]",
		Short:   "Add a BGP peer",
		Example: "  lbctl bgp peer add 198.18.0.1 --as 65000 --hold-time 9s\n  printf '%s' \"$SECRET\" | lbctl bgp peer add 198.18.0.2 --as 65000 --password-stdin",
		Args:    exactArgs("ADDRESS"),
	}
	fs := cmd.Flags()
	fs.Uint32Var(&peerAS, "as", 0, "peer AS number (required)")
	fs.Uint16Var(&port, "port", 0, "peer TCP port (default 179)")
	fs.BoolVar(&passwordStdin, "password-stdin", false, "read the TCP MD5 password from the first line of stdin")
	fs.DurationVar(&holdTime, "hold-time", 0, "hold time, 3s or more (default 90s)")
	fs.DurationVar(&keepalive, "keepalive", 0, "keepalive interval, below the hold time (default a third of it)")
	fs.Uint32Var(&multihopTTL, "ebgp-multihop-ttl", 0, "eBGP multihop TTL; 0 disables multihop")
	fs.BoolVar(&gracefulRestart, "graceful-restart", false, "ask the peer to keep our routes while lbd restarts")
	fs.DurationVar(&grt, "graceful-restart-time", 0, "how long the peer keeps our routes during a restart")
	cmd.RunE = a.run(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		if !cmd.Flags().Changed("as") {
			return usageErrorf("--as is required")
		}
		p := &lbdv1.BgpPeer{
			Address:         args[0],
			PeerAs:          peerAS,
			Port:            uint32(port),
			EbgpMultihopTtl: multihopTTL,
			GracefulRestart: gracefulRestart,
		}
		for _, d := range []struct {
			name string
			val  time.Duration
			dst  **durationpb.Duration
		}{{"hold-time", holdTime, &p.HoldTime}, {"keepalive", keepalive, &p.KeepaliveInterval}, {"graceful-restart-time", grt, &p.GracefulRestartTime}} {
			if cmd.Flags().Changed(d.name) {
				*d.dst = durationpb.New(d.val)
			}
		}
		if passwordStdin {
			pw, err := bufio.NewReader(a.stdin).ReadString('\n')
			if err != nil && err != io.EOF {
				return fmt.Errorf("read password from stdin: %w", err)
			}
			if p.Password = strings.TrimRight(pw, "\r\n"); p.Password == "" {
				return usageErrorf("--password-stdin: stdin holds no password")
			}
		}
		bc, err := a.bgp()
		if err != nil {
			return err
		}
		resp, err := bc.CreateBgpPeer(ctx, &lbdv1.CreateBgpPeerRequest{Peer: p})
		if err != nil {
			return err
		}
		return a.printDone(resp.Peer, "BGP peer %s (AS %d) added", resp.Peer.GetAddress(), resp.Peer.GetPeerAs())
	})
	return cmd
}

func (a *app) bgpPeerDeleteCommand() *cobra.Command {
	return &cobra.Command{
		Use:               "delete ADDRESS",
		Short:             "Delete a BGP peer",
		Args:              exactArgs("ADDRESS"),
		ValidArgsFunction: a.completeArgs(a.completePeers),
		RunE: a.run(func(ctx context.Context, _ *cobra.Command, args []string) error {
			if _, err := netip.ParseAddr(args[0]); err != nil {
				return usageErrorf("%q is not an IP address", args[0])
			}
			bc, err := a.bgp()
			if err != nil {
				return err
			}
			resp, err := bc.DeleteBgpPeer(ctx, &lbdv1.DeleteBgpPeerRequest{Address: args[0]})
			if err != nil {
				return err
			}
			return a.printDone(resp, "BGP peer %s deleted", args[0])
		}),
	}
}
