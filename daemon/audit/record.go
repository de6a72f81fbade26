package audit

import (
	"context"
	"fmt"
	"strings"

	"github.com/lbd-dev/lbd/daemon/authz"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Recorder is the API's outermost interceptor: it counts every call by method and code,
// counts refusals, and writes an audit record for every call that changes state or was
// refused. Install it before the rate limit and the authorization.
type Recorder struct {
	log      *Log
	owner    authz.OwnerFunc
	revision func() uint64
	// skip tells calls refused before authorization that are not worth a line (a rate
	// limit's answers: a flood would fill the trail); they are still counted.
	skip     func(error) bool
	requests *prometheus.CounterVec
	denied   *prometheus.CounterVec
}

// NewRecorder writes to log; owner looks up a stored service's owner (the record names
// it for calls that name only the service), revision returns the store's change
// sequence, skip (may be nil) says which refusals are counted but not written.
func NewRecorder(log *Log, owner authz.OwnerFunc, revision func() uint64, skip func(error) bool) *Recorder {
	if skip == nil {
		skip = func(error) bool { return false }
	}
	return &Recorder{
		log: log, owner: owner, revision: revision, skip: skip,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lbd_api_requests_total", Help: "API calls answered, by method and gRPC status code.",
		}, []string{"method", "code"}),
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lbd_api_denied_total", Help: "API calls refused by the authorization policy (PERMISSION_DENIED or UNAUTHENTICATED), by method and transport.",
		}, []string{"method", "transport"}),
	}
}

// Collectors are the recorder's metrics, for the daemon's registry.
func (r *Recorder) Collectors() []prometheus.Collector {
	return []prometheus.Collector{r.requests, r.denied}
}

// UnaryInterceptor implements grpc.UnaryServerInterceptor.
func (r *Recorder) UnaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	var rec Record
	write := authz.Mutating(info.FullMethod)
	if write {
		// The owner as stored before the call: a delete leaves nothing to ask after it.
		rec = r.describe(req)
	}
	resp, err := handler(ctx, req)
	r.finish(ctx, info.FullMethod, rec, write, err)
	return resp, err
}

// StreamInterceptor implements grpc.StreamServerInterceptor.
func (r *Recorder) StreamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	err := handler(srv, ss)
	r.finish(ss.Context(), info.FullMethod, Record{}, authz.Mutating(info.FullMethod), err)
	return err
}

func (r *Recorder) finish(ctx context.Context, method string, rec Record, write bool, err error) {
	code := status.Code(err)
	name := strings.TrimPrefix(method, "/")
	r.requests.WithLabelValues(name, code.String()).Inc()
	refused := code == codes.PermissionDenied || code == codes.Unauthenticated
	id, idErr := authz.IdentityOf(ctx)
	if refused {
		r.denied.WithLabelValues(name, string(id.Transport)).Inc()
	}
	if !(write || refused) || r.skip(err) {
		return
	}
	rec.Method, rec.Code = name, code.String()
	if idErr == nil {
		rec.Principal, rec.Transport = id.Principal(), string(id.Transport)
	} else {
		rec.Principal = "unknown: " + idErr.Error()
	}
	if err != nil {
		rec.Message = status.Convert(err).Message()
	}
	if write {
		rec.Revision = r.revision()
	}
	r.log.Write(rec)
}

// describe names what a writing request touches.
func (r *Recorder) describe(req any) Record {
	var rec Record
	stored := func(name string) {
		rec.Services = []string{name}
		rec.Owner, _ = r.owner(name)
	}
	backend := func(addr string, port uint32) {
		rec.Backends = []string{fmt.Sprintf("%s:%d", addr, port)}
	}
	switch q := req.(type) {
	case *lbdv1.CreateServiceRequest:
		rec.Services, rec.Owner = []string{q.GetService().GetName()}, q.GetService().GetOwner()
	case *lbdv1.UpdateServiceRequest:
		stored(q.GetService().GetName())
	case *lbdv1.DeleteServiceRequest:
		stored(q.GetName())
	case *lbdv1.ApplyServicesRequest:
		rec.Owner = q.GetOwner()
		for i, s := range q.GetServices() {
			if i == maxNames {
				rec.Omitted = len(q.GetServices()) - maxNames
				break
			}
			rec.Services = append(rec.Services, s.GetName())
		}
	case *lbdv1.CreateBackendRequest:
		stored(q.GetServiceName())
		backend(q.GetBackend().GetAddress(), q.GetBackend().GetPort())
	case *lbdv1.UpdateBackendRequest:
		stored(q.GetServiceName())
		backend(q.GetBackend().GetAddress(), q.GetBackend().GetPort())
	case *lbdv1.DeleteBackendRequest:
		stored(q.GetServiceName())
		backend(q.GetAddress(), q.GetPort())
	case *lbdv1.CreateBgpPeerRequest:
		rec.Peer = q.GetPeer().GetAddress()
	case *lbdv1.UpdateBgpPeerRequest:
		rec.Peer = q.GetPeer().GetAddress()
	case *lbdv1.DeleteBgpPeerRequest:
		rec.Peer = q.GetAddress()
	}
	return rec
}

// Reload records a policy reload: trigger is what caused it, p the policy put in force
// (nil when it failed, err then says why).
func (l *Log) Reload(trigger string, p *authz.Policy, err error) {
	rec := Record{Principal: trigger, Method: "policy.reload", Code: codes.OK.String()}
	if p != nil {
		rec.Policy = p.Source
		if p.Digest != "" {
			rec.Policy += " sha256:" + p.Digest
		}
	}
	if err != nil {
		rec.Code, rec.Message = codes.InvalidArgument.String(), err.Error()
	}
	l.Write(rec)
}
