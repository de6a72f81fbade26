//go:build linux

package nexthop

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
)

// subscribeFunc starts one netlink subscription in the tracker's namespace: updates
// go to ch until done is closed or the socket fails, and then ch is closed.
type subscribeFunc[U any] func(ch chan U, done chan struct{}, onErr func(error)) error

// follow starts the route, address, link and neighbour subscriptions, each in a
// goroutine of wg that ends with ctx. A route matters if it covers a node; any address
// or link change may move a path (the kernel drops routes with an address or a link
// without saying so); a neighbour change matters only for a next hop in use.
func (t *Tracker) follow(ctx context.Context, wg *sync.WaitGroup) {
	ns := t.ns
	wg.Go(func() {
		watch(ctx, t, "route", func(ch chan netlink.RouteUpdate, done chan struct{}, onErr func(error)) error {
			return netlink.RouteSubscribeWithOptions(ch, done, netlink.RouteSubscribeOptions{Namespace: &ns, ErrorCallback: onErr})
		}, func(u netlink.RouteUpdate) bool { return t.covers(u.Dst) })
	})
	wg.Go(func() {
		watch(ctx, t, "address", func(ch chan netlink.AddrUpdate, done chan struct{}, onErr func(error)) error {
			return netlink.AddrSubscribeWithOptions(ch, done, netlink.AddrSubscribeOptions{Namespace: &ns, ErrorCallback: onErr})
		}, func(netlink.AddrUpdate) bool { return true })
	})
	wg.Go(func() {
		watch(ctx, t, "link", func(ch chan netlink.LinkUpdate, done chan struct{}, onErr func(error)) error {
			return netlink.LinkSubscribeWithOptions(ch, done, netlink.LinkSubscribeOptions{Namespace: &ns, ErrorCallback: onErr})
		}, func(netlink.LinkUpdate) bool { return true })
	})
	wg.Go(func() {
		watch(ctx, t, "neighbour", func(ch chan netlink.NeighUpdate, done chan struct{}, onErr func(error)) error {
			return netlink.NeighSubscribeWithOptions(ch, done, netlink.NeighSubscribeOptions{Namespace: &ns, ErrorCallback: onErr})
		}, func(u netlink.NeighUpdate) bool {
			a, ok := netip.AddrFromSlice(u.IP)
			t.mu.Lock()
			defer t.mu.Unlock()
			return ok && t.hops[nhKey{u.LinkIndex, a.Unmap()}]
		})
	})
}

// covers says whether a route to dst may be the one toward a node: the routes a busy
// routing table changes all the time are mostly for other destinations.
func (t *Tracker) covers(dst *net.IPNet) bool {
	if dst == nil {
		return true // a default route
	}
	a, ok := netip.AddrFromSlice(dst.IP)
	ones, _ := dst.Mask.Size()
	p := netip.PrefixFrom(a.Unmap(), ones)
	if !ok || !p.IsValid() {
		return true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, n := range t.nodes {
		if p.Contains(n) {
			return true
		}
	}
	return false
}

// watch keeps one subscription until ctx ends, waking Run on every relevant update,
// and subscribes again after the socket failed. Each new subscription wakes Run too:
// changes made while no socket listened are only seen by resolving again.
func watch[U any](ctx context.Context, t *Tracker, kind string, subscribe subscribeFunc[U], relevant func(U) bool) {
	for ctx.Err() == nil {
		ch := make(chan U, 64)
		done := make(chan struct{})
		onErr := func(err error) {
			select {
			case <-done: // closing the socket fails its last read: nothing to report
			default:
				t.log.Warn("netlink subscription error; resolving again", "op", "subscribe", "kind", kind, "error", err)
				t.kick()
			}
		}
		if err := subscribe(ch, done, onErr); err != nil {
			close(done)
			t.log.Warn("netlink subscription failed", "op", "subscribe", "kind", kind, "error", err)
		} else {
			t.kick()
			consume(ctx, t, ch, relevant)
			close(done)
			for range ch {
				// The library's reader closes ch once its socket is closed; until then
				// it may be blocked sending to ch.
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(resubscribeDelay):
		}
	}
}

// consume wakes Run for every relevant update until ch closes or ctx ends.
func consume[U any](ctx context.Context, t *Tracker, ch <-chan U, relevant func(U) bool) {
	for {
		select {
		case <-ctx.Done():
			return
		case u, ok := <-ch:
			if !ok {
				return
			}
			if relevant(u) {
				t.kick()
			}
		}
	}
}
