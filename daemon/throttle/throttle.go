// Package throttle bounds what one API client can take: a call rate and a number of
// open calls per principal (answered with RESOURCE_EXHAUSTED above them, before a
// call's request is read), and a deadline on every message a stream sends, so a
// client that stops reading cannot hold a stream and its memory forever.
package throttle

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/lbd-dev/lbd/daemon/authz"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// Options configure a Limiter.
type Options struct {
	// Rate is the calls per second each principal may make (a stream counts once, when
	// it opens); 0 disables the limit. Burst is how many it may make at once.
	Rate  float64
	Burst int
	// MaxOpen is how many calls (unary calls and streams) each principal may have open
	// at once; 0 disables the limit.
	MaxOpen int
	// MaxStreams is how many of those may be streams (a watch holds a snapshot of the
	// services for as long as its client takes to read it); 0 disables the limit.
	// IsStream says which methods stream.
	MaxStreams int
	IsStream   func(method string) bool
	// Exempt says which identities no rate applies to (nil: none).
	Exempt func(authz.Identity) bool
	// SendTimeout bounds how long one message of a stream may wait for the client to
	// read; 0 disables it.
	SendTimeout time.Duration
}

// maxPrincipals bounds the principals tracked: past it, those idle for a minute with
// no call open are dropped, and if none is, new principals share one budget.
const maxPrincipals = 10000

// idle is how long a principal's limiter is kept without a call once the table is full.
const idle = time.Minute

// Limiter implements the limits: the rate and the open calls in a tap handle
// (TapHandle), which gRPC runs on a call's headers, before it starts a handler or reads
// the request; the send deadlines as a stream interceptor.
type Limiter struct {
	opts     Options
	mu       sync.Mutex
	clients  map[string]*client
	overflow *client
	limited  *prometheus.CounterVec
	stalled  prometheus.Counter
}

type client struct {
	lim     *rate.Limiter
	last    time.Time
	open    int // calls admitted and not yet ended
	streams int // of which streams
}

// New returns a limiter.
func New(opts Options) *Limiter {
	return &Limiter{
		opts:     opts,
		clients:  map[string]*client{},
		overflow: &client{lim: rate.NewLimiter(rate.Limit(opts.Rate), opts.Burst)},
		limited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lbd_api_rate_limited_total", Help: "API calls refused with RESOURCE_EXHAUSTED because their principal was above api.rate_limit (its rate or its open calls), by transport.",
		}, []string{"transport"}),
		stalled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lbd_api_stalled_streams_total", Help: "Streams ended because a message waited longer than api.stream_send_timeout for the client to read.",
		}),
	}
}

// Collectors are the limiter's metrics.
func (l *Limiter) Collectors() []prometheus.Collector {
	return []prometheus.Collector{l.limited, l.stalled}
}

// RefusalDelay is how long a call above its principal's rate waits before it is refused.
const RefusalDelay = 500 * time.Millisecond

// limitedMsg starts every rate-limit refusal (IsLimited).
const limitedMsg = "rate limit: "

// IsLimited reports whether err is a rate-limit refusal of this package.
func IsLimited(err error) bool {
	s, ok := status.FromError(err)
	return ok && s.Code() == codes.ResourceExhausted && strings.HasPrefix(s.Message(), limitedMsg)
}

// TapHandle implements tap.ServerInHandle: it takes one call from the caller's
// budget and counts it open until its stream ends. It runs on the connection's reading
// goroutine, before gRPC creates the stream: a refused call costs lbd no handler, no
// decoding of its request, and no more of it is read than the client had already sent.
// The refusal waits RefusalDelay, during which lbd reads nothing more from that
// connection: a client that retries at once, in a loop, is slowed to one call per
// RefusalDelay per connection instead of costing lbd work at its own pace.
func (l *Limiter) TapHandle(ctx context.Context, info *tap.Info) (context.Context, error) {
	if l.opts.Rate <= 0 && l.opts.MaxOpen <= 0 && l.opts.MaxStreams <= 0 {
		return ctx, nil
	}
	id, err := authz.IdentityOf(ctx)
	if err != nil || (l.opts.Exempt != nil && l.opts.Exempt(id)) {
		return ctx, nil // without an identity, the authorization refuses it
	}
	key := string(id.Transport) + " " + id.Principal()
	stream := l.opts.IsStream != nil && l.opts.IsStream(info.FullMethodName)
	c, why := l.admit(key, stream)
	if why == "" {
		// The stream's context ends with the stream, whichever way it ends.
		context.AfterFunc(ctx, func() { l.release(c, stream) })
		return ctx, nil
	}
	l.limited.WithLabelValues(string(id.Transport)).Inc()
	t := time.NewTimer(RefusalDelay)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
	}
	return nil, status.Errorf(codes.ResourceExhausted, "%s%s %s; slow down and retry", limitedMsg, id.Principal(), why)
}

// admit takes a call from key's budget and counts it open; it returns why not if it
// cannot.
func (l *Limiter) admit(key string, stream bool) (*client, string) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.clients[key]
	if c == nil {
		if len(l.clients) >= maxPrincipals {
			for k, o := range l.clients {
				if o.open == 0 && now.Sub(o.last) > idle {
					delete(l.clients, k)
				}
			}
		}
		c = l.overflow
		if len(l.clients) < maxPrincipals {
			c = &client{lim: rate.NewLimiter(rate.Limit(l.opts.Rate), l.opts.Burst)}
			l.clients[key] = c
		}
	}
	c.last = now
	if l.opts.MaxOpen > 0 && c.open >= l.opts.MaxOpen {
		return nil, fmt.Sprintf("has %d calls open, the most a principal may (api.rate_limit.max_open)", c.open)
	}
	if stream && l.opts.MaxStreams > 0 && c.streams >= l.opts.MaxStreams {
		return nil, fmt.Sprintf("has %d streams open, the most a principal may (api.rate_limit.max_streams)", c.streams)
	}
	if l.opts.Rate > 0 && !c.lim.AllowN(now, 1) {
		return nil, fmt.Sprintf("made more than %g calls per second (burst %d, api.rate_limit)", l.opts.Rate, l.opts.Burst)
	}
	c.open++
	if stream {
		c.streams++
	}
	return c, ""
}

// release counts one of c's calls ended.
func (l *Limiter) release(c *client, stream bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c.open--
	if stream {
		c.streams--
	}
}

// StreamInterceptor implements grpc.StreamServerInterceptor. With a send timeout, the
// handler runs apart: when one of its messages waits too long for the client, the call
// ends with DEADLINE_EXCEEDED, which closes the stream and so ends the blocked send.
func (l *Limiter) StreamInterceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if l.opts.SendTimeout <= 0 {
		return handler(srv, ss)
	}
	ws := &watchedStream{ServerStream: ss, timeout: l.opts.SendTimeout, stalled: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- handler(srv, ws) }()
	select {
	case err := <-done:
		return err
	case <-ws.stalled:
		l.stalled.Inc()
		return status.Error(codes.DeadlineExceeded, fmt.Sprintf("a message of this stream waited more than %s for the client to read it (api.stream_send_timeout); the stream is ended", l.opts.SendTimeout))
	}
}

// watchedStream times each SendMsg.
type watchedStream struct {
	grpc.ServerStream
	timeout time.Duration
	once    sync.Once
	stalled chan struct{}
}

func (s *watchedStream) SendMsg(m any) error {
	t := time.AfterFunc(s.timeout, func() { s.once.Do(func() { close(s.stalled) }) })
	defer t.Stop()
	return s.ServerStream.SendMsg(m)
}
