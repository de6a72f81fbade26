package lbd

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/api"
	"github.com/lbd-dev/lbd/daemon/audit"
	"github.com/lbd-dev/lbd/daemon/authz"
	"github.com/lbd-dev/lbd/daemon/config"
	"github.com/lbd-dev/lbd/daemon/metrics"
	"github.com/lbd-dev/lbd/daemon/store"
	"github.com/lbd-dev/lbd/daemon/throttle"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// apiWindow is the API's flow-control window per stream and per connection.
const apiWindow = 64 << 10

// apiSecurity is what stands between a client and the API: the audit recorder and
// request counters, the rate limit and stream deadlines, the authorization policy.
type apiSecurity struct {
	guard    *authz.Guard
	reloader *authz.Reloader
	trail    *audit.Log
	recorder *audit.Recorder
	limiter  *throttle.Limiter
	opts     []grpc.ServerOption
}

// newSecurity loads the policy and builds the interceptors and server options both
// listeners share.
func newSecurity(c config.API, st *store.Store, met *metrics.Metrics, log hclog.Logger) (*apiSecurity, error) {
	self := uint32(os.Geteuid())
	p, err := authz.Load(c.PolicyFile, self)
	if err != nil {
		return nil, fmt.Errorf("api.policy_file: %w", err)
	}
	owner := func(name string) (string, bool) {
		svc, err := st.GetService(name)
		if err != nil {
			return "", false
		}
		return svc.GetOwner(), true
	}
	s := &apiSecurity{
		guard: authz.NewGuard(p, owner, api.WithOwnerCheck),
		trail: audit.Open(audit.Options{File: c.Audit.File, MaxSizeMB: c.Audit.MaxSizeMB, MaxBackups: c.Audit.MaxBackups,
			MaxAgeDays: c.Audit.MaxAgeDays, Logger: log.Named("audit")}),
		limiter: throttle.New(throttle.Options{Rate: c.RateLimit.Rate, Burst: c.RateLimit.Burst, MaxOpen: c.RateLimit.MaxOpen,
			MaxStreams: c.RateLimit.MaxStreams, IsStream: isStream,
			SendTimeout: time.Duration(c.StreamSendTimeout),
			// Root and lbd's user on the socket own the node (and the state file): a rate
			// would protect lbd from nobody, and would fail their scripts' bulk changes.
			Exempt: func(id authz.Identity) bool {
				return id.Transport == authz.TransportUnix && (id.UID == 0 || id.UID == int64(self))
			}}),
	}
	s.recorder = audit.NewRecorder(s.trail, owner, st.Seq, throttle.IsLimited)
	met.Register(s.recorder.Collectors()...)
	met.Register(s.limiter.Collectors()...)
	plog := log.Named("authz")
	s.reloader = &authz.Reloader{Guard: s.guard, Path: c.PolicyFile, Self: self, Interval: time.Duration(c.PolicyCheckInterval),
		OnReload: func(trigger string, p *authz.Policy, err error) {
			s.trail.Reload(trigger, p, err)
			if err != nil {
				plog.Error("policy not reloaded; the previous one stays in force", "op", "reload", "trigger", trigger, "error", err)
				return
			}
			plog.Info("policy reloaded", "op", "reload", "trigger", trigger, "policy", p.String(), "sha256", p.Digest)
		}}
	s.trail.Reload("start", p, nil)
	plog.Info("authorization policy", "op", "start", "policy", p.String(), "sha256", p.Digest)
	s.opts = []grpc.ServerOption{
		// The rate and open calls of each principal are checked on a call's headers,
		// before gRPC starts a handler or reads the request.
		grpc.InTapHandle(s.limiter.TapHandle),
		grpc.ChainUnaryInterceptor(s.recorder.UnaryInterceptor, s.guard.UnaryInterceptor),
		grpc.ChainStreamInterceptor(s.recorder.StreamInterceptor, s.limiter.StreamInterceptor, s.guard.StreamInterceptor),
		grpc.MaxConcurrentStreams(c.MaxConcurrentStreams),
		grpc.MaxRecvMsgSize(c.MaxRecvMsgBytes),
		// Fixed flow-control windows (gRPC grows them by default): a request refused for
		// its size costs lbd at most a window of reading and decrypting, not the whole
		// message.
		grpc.InitialWindowSize(apiWindow),
		grpc.InitialConnWindowSize(apiWindow),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Duration(c.KeepaliveMinTime), PermitWithoutStream: true}),
		// Pings an idle connection's client to find peers that went away without closing.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 2 * time.Minute, Timeout: 20 * time.Second}),
	}
	return s, nil
}

// run reloads the policy on SIGHUP (hup) and when its file changes, until ctx ends.
func (s *apiSecurity) run(ctx context.Context, hup <-chan os.Signal) { s.reloader.Run(ctx, hup) }

// close closes the audit file.
func (s *apiSecurity) close() error { return s.trail.Close() }

// isStream reports whether method ("/package.Service/Method") streams, from its
// registered descriptor.
func isStream(method string) bool {
	svc, name, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return false
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return false
	}
	md := sd.Methods().ByName(protoreflect.Name(name))
	return md != nil && (md.IsStreamingServer() || md.IsStreamingClient())
}
