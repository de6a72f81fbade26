package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"time"

	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/translate"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// lbdCallTimeout bounds one call to lbd: a hung lbd must not wedge the adapter.
const lbdCallTimeout = 30 * time.Second

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
	ctx, cancel := context.WithTimeout(ctx, lbdCallTimeout)
	defer cancel()
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
	ctx, cancel := context.WithTimeout(ctx, lbdCallTimeout)
	defer cancel()
	resp, err := l.client.ApplyServices(ctx, &lbdv1.ApplyServicesRequest{Owner: l.owner, Services: svcs})
	if err != nil {
		return nil, fmt.Errorf("apply %d services to lbd: %w", len(svcs), err)
	}
	return resp, nil
}

// rejectedFieldRE reads the field lbd names in an error about one service of an apply:
// "services[3].backends[1].address: ..." (lbd's errors start with the request field).
var rejectedFieldRE = regexp.MustCompile(`^services\[(\d+)\](?:\.backends\[(\d+)\])?(\S*): (.*)$`)

// rejection is what lbd refused in an apply: one service, or one backend of it.
type rejection struct {
	service int
	backend int // -1: the whole service
	field   string
	msg     string
}

// rejected reads which service (and backend) of svcs an apply error is about; ok is false
// for an error about the request as a whole, or one that lbd did not answer.
func rejected(err error, svcs []*lbdv1.Service) (rejection, bool) {
	st, ok := grpcStatus(err)
	if !ok {
		return rejection{}, false
	}
	switch st.Code() {
	case codes.InvalidArgument, codes.AlreadyExists, codes.FailedPrecondition:
	default:
		return rejection{}, false
	}
	m := rejectedFieldRE.FindStringSubmatch(st.Message())
	if m == nil {
		return rejection{}, false
	}
	r := rejection{backend: -1, msg: m[4]}
	r.service, _ = strconv.Atoi(m[1])
	if r.service >= len(svcs) {
		return rejection{}, false
	}
	r.field = m[3]
	if m[2] != "" {
		b, _ := strconv.Atoi(m[2])
		if b >= len(svcs[r.service].Backends) {
			return rejection{}, false
		}
		r.backend = b
		r.field = fmt.Sprintf("backends[%d]%s", b, m[3])
	}
	r.field = trimDot(r.field)
	return r, true
}

func trimDot(s string) string {
	if len(s) > 0 && s[0] == '.' {
		return s[1:]
	}
	return s
}

// grpcStatus is lbd's status inside err's chain (status.FromError of a wrapped error
// would put the whole chain's text in the message).
func grpcStatus(err error) (*status.Status, bool) {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return nil, false
	}
	return se.GRPCStatus(), true
}

// watch follows lbd's services of our owner. It calls specChanged after every
// (re)connection and whenever a service's spec changed, so a restarted lbd (whose state
// may be lost or old) and an operator's edit of our services are both repaired by the next
// apply, and it keeps each service's status in st (calling statusChanged), which the
// conditions and Events report. It returns when ctx is done; lbd being down only makes it
// wait.
func (l *lbdSink) watch(ctx context.Context, st *state, specChanged, statusChanged func()) {
	wait := time.Duration(0)
	for ctx.Err() == nil {
		if wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		err := l.watchOnce(ctx, st, specChanged, statusChanged)
		if ctx.Err() != nil {
			return
		}
		l.log.Info("lbd watch ended, reconnecting", "op", "watch", "err", err)
		wait = min(max(2*wait, 200*time.Millisecond), 5*time.Second)
	}
}

func (l *lbdSink) watchOnce(ctx context.Context, st *state, specChanged, statusChanged func()) error {
	// WaitForReady blocks until lbd is reachable instead of failing at once.
	stream, err := l.client.WatchServices(ctx, &lbdv1.WatchServicesRequest{Owner: l.owner}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("watch lbd services: %w", err)
	}
	synced := false
	// Spec revisions seen: a MODIFIED event with the same revision is a status change
	// (health, programming), which an apply would not alter.
	revisions := map[string]uint64{}
	statuses := map[string]*lbdv1.ServiceStatus{}
	for {
		ev, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("receive lbd watch event: %w", err)
		}
		switch ev.Type {
		case lbdv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED:
			synced = true
			l.log.Info("lbd connected", "op", "watch")
			st.setLbd(statuses)
			specChanged()
			statusChanged()
			continue
		case lbdv1.WatchEventType_WATCH_EVENT_TYPE_DELETED:
			name := ev.Service.GetName()
			delete(revisions, name)
			delete(statuses, name)
			if synced {
				st.setLbdService(name, nil)
			}
		default:
			name, rev := ev.Service.GetName(), ev.Service.GetRevision()
			statuses[name] = ev.Service.GetStatus()
			if synced {
				st.setLbdService(name, ev.Service.GetStatus())
				statusChanged()
			}
			if old, seen := revisions[name]; seen && old == rev {
				continue
			}
			revisions[name] = rev
		}
		if synced {
			specChanged()
		}
	}
}
