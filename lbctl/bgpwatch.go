package lbctl

import (
	"context"
	"fmt"
	"slices"
	"strings"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// bgpPeersWatch is "bgp peers -w": the peers as now, sorted by address, then one row per
// change with the event in front, until interrupted (or --timeout).
func (a *app) bgpPeersWatch(ctx context.Context) error {
	bc, err := a.bgp()
	if err != nil {
		return err
	}
	stream, err := bc.WatchBgpPeers(ctx, &lbdv1.WatchBgpPeersRequest{})
	if err != nil {
		return err
	}
	var initial []*lbdv1.WatchBgpPeersResponse
	synced := false
	rows := &streamTable{}
	for {
		ev, err := stream.Recv()
		if err != nil {
			return watchEnded(ctx, err)
		}
		a.opts.answered = true
		switch {
		case !synced && ev.Type == lbdv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED:
			synced = true
			slices.SortFunc(initial, func(x, y *lbdv1.WatchBgpPeersResponse) int {
				return compareAddr(x.GetPeer().GetAddress(), y.GetPeer().GetAddress())
			})
			if a.opts.output != "table" {
				for _, ev := range append(initial, ev) {
					if err := a.printEvent(ev); err != nil {
						return err
					}
				}
				break
			}
			// The current state is sized as one table; later rows follow its columns.
			all := [][]string{peerRow("EVENT", peerHeader)}
			for _, ev := range initial {
				all = append(all, peerRow(label(ev.Type, "-"), a.peerCells(ev.Peer)))
			}
			rows.fit([]string{"modified"}) // the widest event
			for _, c := range all {
				rows.fit(c)
			}
			for _, c := range all {
				rows.add(&a.out, c)
			}
		case !synced:
			initial = append(initial, ev)
		case a.opts.output != "table":
			if err := a.printEvent(ev); err != nil {
				return err
			}
		default:
			rows.add(&a.out, peerRow(label(ev.Type, "-"), a.peerCells(ev.Peer)))
		}
		if err := a.flush(); err != nil {
			return err
		}
	}
}

// peerRow is a row of the peer watch: the event, then the peer table's cells.
func peerRow(event string, cells []any) []string {
	out := []string{event}
	for _, c := range cells {
		out = append(out, strings.TrimSpace(fmt.Sprint(c)))
	}
	return out
}
