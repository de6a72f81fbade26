package controller

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/translate"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
)

// DialLbd connects to lbd's API (a Unix socket: the adapter is lbd's sidecar). The
// connection is lazy and redials by itself; its backoff is capped low so that a restarted
// lbd is reprogrammed within seconds, not gRPC's default two minutes.
func DialLbd(target string) (*grpc.ClientConn, error) {
	bo := backoff.DefaultConfig
	bo.MaxDelay = 2 * time.Second
	conn, err := grpc.NewClient(target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: 2 * time.Second}))
	if err != nil {
		return nil, fmt.Errorf("dial lbd %s: %w", target, err)
	}
	return conn, nil
}

// lbdSink programs one lbd with the services of one owner.
type lbdSink struct {
	client lbdv1.LoadBalancerServiceClient
	owner  string
	log    *slog.Logger
}

// taken lists what other owners hold in lbd, so that a clash with them costs one Service,
// not the whole all-or-nothing apply.
func (l *lbdSink) taken(ctx context.Context) (translate.Taken, error) {
	resp, err := l.client.ListServices(ctx, &lbdv1.ListServicesRequest{})
	if err != nil {
		return translate.Taken{}, fmt.Errorf("list lbd services: %w", err)
	}
	t := translate.Taken{Frontends: map[translate.Frontend]string{}, Names: map[string]bool{}}
	for _, s := range resp.Services {
		if s.Owner == l.owner {
			continue
		}
		t.Names[s.Name] = true
		if fe, ok := translate.FrontendOf(s); ok {
			t.Frontends[fe] = s.Name
		}
	}
	return t, nil
}

func (l *lbdSink) apply(ctx context.Context, svcs []*lbdv1.Service) (*lbdv1.ApplyServicesResponse, error) {
	resp, err := l.client.ApplyServices(ctx, &lbdv1.ApplyServicesRequest{Owner: l.owner, Services: svcs})
	if err != nil {
		return nil, fmt.Errorf("apply %d services to lbd: %w", len(svcs), err)
	}
	return resp, nil
}

// watch follows lbd's services of our owner and calls changed after every (re)connection
// and on every change: a restarted lbd (whose state may be lost or old) and an operator's
// edit of our services are both repaired by the next apply. It returns when ctx is done;
// lbd being down only makes it wait.
func (l *lbdSink) watch(ctx context.Context, changed func()) {
	wait := time.Duration(0)
	for ctx.Err() == nil {
		if wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		err := l.watchOnce(ctx, changed)
		if ctx.Err() != nil {
			return
		}
		l.log.Info("lbd watch ended, reconnecting", "op", "watch", "err", err)
		wait = min(max(2*wait, 200*time.Millisecond), 5*time.Second)
	}
}

func (l *lbdSink) watchOnce(ctx context.Context, changed func()) error {
	// WaitForReady blocks until lbd is reachable instead of failing at once.
	stream, err := l.client.WatchServices(ctx, &lbdv1.WatchServicesRequest{Owner: l.owner}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("watch lbd services: %w", err)
	}
	synced := false
	// Spec revisions seen: a MODIFIED event with the same revision is a status change
	// (health, programming), which an apply would not alter.
	revisions := map[string]uint64{}
	for {
		ev, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("receive lbd watch event: %w", err)
		}
		switch ev.Type {
		case lbdv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED:
			synced = true
			l.log.Info("lbd connected", "op", "watch")
			changed()
			continue
		case lbdv1.WatchEventType_WATCH_EVENT_TYPE_DELETED:
			delete(revisions, ev.Service.GetName())
		default:
			name, rev := ev.Service.GetName(), ev.Service.GetRevision()
			if old, seen := revisions[name]; seen && old == rev {
				continue
			}
			revisions[name] = rev
		}
		if synced {
			changed()
		}
	}
}
