package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
)

// retryWait is how long the registration and the node watch wait before trying etcd
// again after a failure.
const retryWait = time.Second

// KeepRegistered keeps PREFIX/nodes/NAME holding the latest registration that updates
// delivers, under a lease of ttl that it renews: when this node stops (or loses etcd
// for longer than ttl) its registration disappears from the fleet. A lease lost while
// etcd was unreachable is granted again once it answers. It returns when ctx ends,
// revoking the lease.
func (c *Client) KeepRegistered(ctx context.Context, name string, ttl time.Duration, updates <-chan *lbdv1.FleetNode) error {
	if name == "" || strings.Contains(name, "/") {
		return fmt.Errorf("store.node_name: %q must be non-empty, without /", name)
	}
	key := c.nodesPrefix() + name
	var latest *lbdv1.FleetNode
	select {
	case <-ctx.Done():
		return nil
	case latest = <-updates:
	}
	for ctx.Err() == nil {
		err := c.register(ctx, key, ttl, &latest, updates)
		if ctx.Err() != nil {
			return nil
		}
		c.log.Warn("fleet registration lost; registering again", "op", "fleet", "node", name, "error", err)
		select {
		case <-ctx.Done():
		case <-time.After(retryWait):
		}
	}
	return nil
}

// register grants a lease, writes the registration and keeps both current until the
// lease is lost or ctx ends.
func (c *Client) register(ctx context.Context, key string, ttl time.Duration, latest **lbdv1.FleetNode, updates <-chan *lbdv1.FleetNode) error {
	gctx, cancel := context.WithTimeout(ctx, c.timeout)
	lease, err := c.cli.Grant(gctx, int64((ttl+time.Second-1)/time.Second))
	cancel()
	if err != nil {
		return unavailable("grant a lease", err)
	}
	defer func() {
		// A stopping node leaves the fleet at once rather than after ttl.
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c.cli.Revoke(rctx, lease.ID)
	}()
	put := func(n *lbdv1.FleetNode) error {
		v, err := proto.Marshal(n)
		if err != nil {
			return fmt.Errorf("encode registration: %w", err)
		}
		pctx, cancel := context.WithTimeout(ctx, c.timeout)
		defer cancel()
		if _, err := c.cli.Put(pctx, key, string(v), clientv3.WithLease(lease.ID)); err != nil {
			return unavailable("write the registration", err)
		}
		return nil
	}
	if err := put(*latest); err != nil {
		return err
	}
	kctx, kcancel := context.WithCancel(ctx)
	defer kcancel()
	alive, err := c.cli.KeepAlive(kctx, lease.ID)
	if err != nil {
		return unavailable("renew the lease", err)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-alive:
			if !ok {
				return unavailable("renew the lease", errors.New("the lease expired or etcd stopped answering"))
			}
		case n := <-updates:
			*latest = n
			if err := put(n); err != nil {
				return err
			}
		}
	}
}

// WatchNodes calls fn with every registered node, by name, at start and after every
// change, until ctx ends; ok is false while etcd cannot be reached (nodes is then the
// last set seen). It never gives up: a broken watch reads everything again.
func (c *Client) WatchNodes(ctx context.Context, fn func(nodes map[string]*lbdv1.FleetNode, rev int64, ok bool)) {
	var last map[string]*lbdv1.FleetNode
	var lastRev int64
	for ctx.Err() == nil {
		err := c.watchNodes(ctx, func(n map[string]*lbdv1.FleetNode, rev int64) {
			last, lastRev = n, rev
			fn(n, rev, true)
		})
		if ctx.Err() != nil {
			return
		}
		fn(last, lastRev, false)
		c.log.Debug("fleet node watch broken; reading again", "op", "fleet", "error", err)
		select {
		case <-ctx.Done():
		case <-time.After(retryWait):
		}
	}
}

func (c *Client) watchNodes(ctx context.Context, fn func(map[string]*lbdv1.FleetNode, int64)) error {
	gctx, cancel := context.WithTimeout(ctx, c.timeout)
	resp, err := c.cli.Get(gctx, c.nodesPrefix(), clientv3.WithPrefix())
	cancel()
	if err != nil {
		return unavailable("read the fleet's nodes", err)
	}
	nodes := map[string]*lbdv1.FleetNode{}
	for _, kv := range resp.Kvs {
		n := &lbdv1.FleetNode{}
		if err := proto.Unmarshal(kv.Value, n); err != nil {
			c.log.Warn("unreadable fleet registration ignored", "op", "fleet", "key", string(kv.Key), "error", err)
			continue
		}
		nodes[strings.TrimPrefix(string(kv.Key), c.nodesPrefix())] = n
	}
	rev := resp.Header.Revision
	fn(clone(nodes), rev)
	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer wcancel()
	for wr := range c.cli.Watch(wctx, c.nodesPrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
		if err := wr.Err(); err != nil {
			return unavailable("watch the fleet's nodes", err)
		}
		for _, ev := range wr.Events {
			name := strings.TrimPrefix(string(ev.Kv.Key), c.nodesPrefix())
			if ev.Type == clientv3.EventTypeDelete {
				delete(nodes, name)
				continue
			}
			n := &lbdv1.FleetNode{}
			if err := proto.Unmarshal(ev.Kv.Value, n); err != nil {
				c.log.Warn("unreadable fleet registration ignored", "op", "fleet", "key", string(ev.Kv.Key), "error", err)
				continue
			}
			nodes[name] = n
		}
		fn(clone(nodes), wr.Header.Revision)
	}
	if ctx.Err() != nil {
		return nil
	}
	return unavailable("watch the fleet's nodes", errors.New("the watch ended"))
}

func clone(m map[string]*lbdv1.FleetNode) map[string]*lbdv1.FleetNode {
	out := make(map[string]*lbdv1.FleetNode, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
