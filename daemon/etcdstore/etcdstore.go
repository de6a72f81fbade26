// Package etcdstore keeps a fleet's services in etcd (go.etcd.io/etcd/client/v3): every
// LB node of the fleet reads and writes one prefix, each change is an etcd transaction
// that compares the revision of a head key first (compare-and-swap: a writer whose view
// is behind is refused and tries again on the newer state), and every node follows the
// changes with a watch. Nodes register themselves under a lease.
//
// Keys below the prefix:
//
//	state/head             statev1.FleetHead: hash seed, released IDs; rewritten by every change
//	state/services/NAME    lbdv1.Service: spec, IDs and revision (no status)
//	nodes/NAME             lbdv1.FleetNode: a node's registration, under its lease
package etcdstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	statev1 "github.com/lbd-dev/lbd/proto/lbd/state/v1"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/protobuf/proto"
)

// Errors of the store's operations.
var (
	// ErrConflict: another node changed the fleet's services since the revision the
	// change was based on; nothing was written.
	ErrConflict = errors.New("the fleet's services changed meanwhile")
	// ErrUnavailable wraps every failure to reach etcd: nothing may have been written
	// (or, for a write whose answer was lost, it may have been: the watch tells).
	ErrUnavailable = errors.New("etcd is unreachable")
	// ErrCompacted: the revision to watch from was compacted away; read the whole
	// state again.
	ErrCompacted = errors.New("the revision to watch from was compacted")
)

// Options configure the connection to etcd.
type Options struct {
	// Endpoints are the members' client URLs (https://host:2379 with TLS).
	Endpoints []string
	// Prefix of every key of the fleet, e.g. "/lbd/edge-1/".
	Prefix string
	// CAFile verifies the members' certificates; CertFile and KeyFile are this node's
	// client certificate. All empty: plain connections.
	CAFile, CertFile, KeyFile string
	// Timeout bounds each request (default 5 s): a write waits no longer for a quorum.
	Timeout time.Duration
	Logger  hclog.Logger
}

// Client is a connection to the fleet's etcd cluster.
type Client struct {
	cli       *clientv3.Client
	endpoints []string
	tls       *tls.Config
	prefix    string
	timeout   time.Duration
	log       hclog.Logger
}

// Open prepares a client. It does not wait for etcd: an unreachable cluster shows up as
// ErrUnavailable from the first request.
func Open(opts Options) (*Client, error) {
	if len(opts.Endpoints) == 0 {
		return nil, errors.New("store.endpoints: at least one etcd endpoint is required")
	}
	if opts.Prefix == "" || !strings.HasSuffix(opts.Prefix, "/") {
		return nil, fmt.Errorf("store.prefix: %q must be non-empty and end with /", opts.Prefix)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	tlsCfg, err := clientTLS(opts)
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   opts.Endpoints,
		TLS:         tlsCfg,
		DialTimeout: opts.Timeout,
		// Keepalives notice a dead connection to a member within seconds, so that
		// requests and watches move to another one.
		DialKeepAliveTime:    2 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
		// The client's own zap logs would bypass lbd's logger; its errors reach lbd as
		// errors.
		Logger: zap.NewNop(),
		// gRPC's reconnection backoff grows to two minutes: after an outage of the
		// whole cluster a node would stay cut off that long once etcd is back.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 250 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 2 * time.Second,
		})},
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	return &Client{cli: cli, endpoints: opts.Endpoints, tls: tlsCfg, prefix: opts.Prefix, timeout: opts.Timeout, log: opts.Logger}, nil
}

func clientTLS(o Options) (*tls.Config, error) {
	if o.CAFile == "" && o.CertFile == "" && o.KeyFile == "" {
		return nil, nil
	}
	if o.CAFile == "" || o.CertFile == "" || o.KeyFile == "" {
		return nil, errors.New("store.tls: give ca_file, cert_file and key_file together")
	}
	cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("store.tls: load client certificate: %w", err)
	}
	pem, err := os.ReadFile(o.CAFile)
	if err != nil {
		return nil, fmt.Errorf("store.tls: read CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("store.tls: no PEM certificate in %s", o.CAFile)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.cli.Close() }

// Prefix is the fleet's key prefix.
func (c *Client) Prefix() string { return c.prefix }

func (c *Client) headKey() string               { return c.prefix + "state/head" }
func (c *Client) servicesPrefix() string        { return c.prefix + "state/services/" }
func (c *Client) serviceKey(name string) string { return c.servicesPrefix() + name }
func (c *Client) nodesPrefix() string           { return c.prefix + "nodes/" }

// unavailable wraps a failed request: every error that is not an answer of etcd's
// about the request itself means the cluster could not be reached or had no quorum.
func unavailable(op string, err error) error {
	return fmt.Errorf("%s: %w: %w", op, ErrUnavailable, err)
}

// State is the fleet's services as read at one revision.
type State struct {
	// Revision is etcd's revision of the read; HeadRevision the head key's (0: the
	// fleet has no head yet: nothing was ever written under the prefix).
	Revision, HeadRevision int64
	Head                   *statev1.FleetHead
	Services               []*lbdv1.Service
}

// Load reads the head and every service in one consistent read.
func (c *Client) Load(ctx context.Context) (State, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.cli.Get(ctx, c.prefix+"state/", clientv3.WithPrefix())
	if err != nil {
		return State{}, c.unreachable("read the fleet's services", err)
	}
	st := State{Revision: resp.Header.Revision, Head: &statev1.FleetHead{}}
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		switch {
		case key == c.headKey():
			if err := proto.Unmarshal(kv.Value, st.Head); err != nil {
				return State{}, fmt.Errorf("%s: %w", key, err)
			}
			st.HeadRevision = kv.ModRevision
		case strings.HasPrefix(key, c.servicesPrefix()):
			svc := &lbdv1.Service{}
			if err := proto.Unmarshal(kv.Value, svc); err != nil {
				return State{}, fmt.Errorf("%s: %w", key, err)
			}
			if svc.Name != strings.TrimPrefix(key, c.servicesPrefix()) {
				return State{}, fmt.Errorf("%s holds service %q", key, svc.Name)
			}
			st.Services = append(st.Services, svc)
		}
	}
	return st, nil
}

// Commit writes a change of the services: puts and deletes, and the new head, if the
// head's revision is still headRev (0: no head yet). It returns the head's new revision,
// ErrConflict if another change came first, or an error wrapping ErrUnavailable.
// etcd refuses a transaction of more than its --max-txn-ops operations (default 128):
// each put or delete is one, the head another.
func (c *Client) Commit(ctx context.Context, headRev int64, head *statev1.FleetHead, puts []*lbdv1.Service, deletes []string) (int64, error) {
	hv, err := proto.MarshalOptions{Deterministic: true}.Marshal(head)
	if err != nil {
		return 0, fmt.Errorf("encode head: %w", err)
	}
	ops := make([]clientv3.Op, 0, len(puts)+len(deletes)+1)
	for _, svc := range puts {
		v, err := proto.MarshalOptions{Deterministic: true}.Marshal(svc)
		if err != nil {
			return 0, fmt.Errorf("encode service %s: %w", svc.Name, err)
		}
		ops = append(ops, clientv3.OpPut(c.serviceKey(svc.Name), string(v)))
	}
	for _, name := range deletes {
		ops = append(ops, clientv3.OpDelete(c.serviceKey(name)))
	}
	ops = append(ops, clientv3.OpPut(c.headKey(), string(hv)))
	cmp := clientv3.Compare(clientv3.ModRevision(c.headKey()), "=", headRev)
	if headRev == 0 {
		cmp = clientv3.Compare(clientv3.CreateRevision(c.headKey()), "=", 0)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.cli.Txn(ctx).If(cmp).Then(ops...).Commit()
	switch {
	case errors.Is(err, rpctypes.ErrTooManyOps):
		return 0, fmt.Errorf("the change writes %d keys, more than etcd's --max-txn-ops allows: raise it on the members (lbd's fleet guide sets 10000) or change fewer services at once: %w", len(ops), err)
	case errors.Is(err, rpctypes.ErrRequestTooLarge):
		return 0, fmt.Errorf("the change is larger than etcd's --max-request-bytes allows: raise it on the members or change fewer services at once: %w", err)
	case err != nil:
		return 0, c.unreachable("write the fleet's services", err)
	case !resp.Succeeded:
		return 0, ErrConflict
	}
	return resp.Header.Revision, nil
}

// Change is one change of the fleet's services, as a watch sees it: everything one
// transaction wrote.
type Change struct {
	// Revision is the change's; Head is the new head when the change rewrote it (every
	// lbd change does).
	Revision int64
	Head     *statev1.FleetHead
	Puts     []*lbdv1.Service
	Deletes  []string
}

// Watch calls fn with every change of the services after revision rev, in order, until
// ctx ends (nil), fn fails (its error), the revision was compacted (ErrCompacted) or the
// watch breaks (an error wrapping ErrUnavailable). The watch requires a member with a
// leader, so that a member cut off from the others does not keep it silently waiting.
func (c *Client) Watch(ctx context.Context, rev int64, fn func(Change) error) error {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := c.cli.Watch(ctx, c.prefix+"state/", clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	for resp := range wch {
		if resp.CompactRevision > 0 {
			return fmt.Errorf("%w: watch from %d, compacted up to %d", ErrCompacted, rev+1, resp.CompactRevision)
		}
		if err := resp.Err(); err != nil {
			return c.unreachable("watch the fleet's services", err)
		}
		var ch *Change
		flush := func() error {
			if ch == nil {
				return nil
			}
			err := fn(*ch)
			ch = nil
			return err
		}
		for _, ev := range resp.Events {
			if ch != nil && ev.Kv.ModRevision != ch.Revision {
				if err := flush(); err != nil {
					return err
				}
			}
			if ch == nil {
				ch = &Change{Revision: ev.Kv.ModRevision}
			}
			key := string(ev.Kv.Key)
			switch {
			case key == c.headKey() && ev.Type == clientv3.EventTypePut:
				h := &statev1.FleetHead{}
				if err := proto.Unmarshal(ev.Kv.Value, h); err != nil {
					return fmt.Errorf("%s: %w", key, err)
				}
				ch.Head = h
			case strings.HasPrefix(key, c.servicesPrefix()) && ev.Type == clientv3.EventTypePut:
				svc := &lbdv1.Service{}
				if err := proto.Unmarshal(ev.Kv.Value, svc); err != nil {
					return fmt.Errorf("%s: %w", key, err)
				}
				ch.Puts = append(ch.Puts, svc)
			case strings.HasPrefix(key, c.servicesPrefix()) && ev.Type == clientv3.EventTypeDelete:
				ch.Deletes = append(ch.Deletes, strings.TrimPrefix(key, c.servicesPrefix()))
			}
		}
		if err := flush(); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil
	}
	return unavailable("watch the fleet's services", errors.New("the watch ended"))
}

// Ping asks the cluster for a linearizable read of the head: it succeeds only with a
// quorum.
func (c *Client) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if _, err := c.cli.Get(ctx, c.headKey(), clientv3.WithCountOnly()); err != nil {
		return c.unreachable("reach etcd", err)
	}
	return nil
}
