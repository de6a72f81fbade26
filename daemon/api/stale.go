package api

import (
	"context"
	"strings"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// StaleHeader is the response header of every call (unary, and streams as they start)
// answered while the node's services may be behind its fleet's (the etcd store cannot
// be reached, or has not been read since the node started): its value says why, and as
// of when.
const StaleHeader = "lbd-stale"

// staleCheckInterval is how often an open watch looks whether the node's staleness
// changed, to tell a client that asked (WatchServicesRequest.staleness_events): the
// fleet's probe notices a change about as often.
const staleCheckInterval = time.Second

// UnaryInterceptor states the staleness of what the node serves (StaleHeader).
func (s *Server) UnaryInterceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if r := s.staleHeader(); r != "" {
		_ = grpc.SetHeader(ctx, metadata.Pairs(StaleHeader, r))
	}
	return handler(ctx, req)
}

// staleHeader is the node's staleness as a header value (printable ASCII), or "".
func (s *Server) staleHeader() string {
	return strings.Map(func(c rune) rune {
		if c < 0x20 || c > 0x7e {
			return '?'
		}
		return c
	}, s.st.Stale())
}

// watchStaleness is what a watch told its client about the node's staleness.
type watchStaleness struct {
	reason func() string
	// events: the client asked for STALENESS events.
	events bool
	// told: the client was last told that the node is stale.
	told bool
}

// stamp sets an event's stale reason as of now.
func (w *watchStaleness) stamp(ev *lbdv1.WatchServicesResponse) *lbdv1.WatchServicesResponse {
	r := w.reason()
	if w.told = r != ""; w.told {
		ev.StaleReason = &r
	}
	return ev
}

// changed returns a STALENESS event when the node became stale or stopped being so
// since the client was last told, and the client asked for such events; else nil.
func (w *watchStaleness) changed() *lbdv1.WatchServicesResponse {
	if !w.events || (w.reason() != "") == w.told {
		return nil
	}
	return w.stamp(&lbdv1.WatchServicesResponse{Type: lbdv1.WatchEventType_WATCH_EVENT_TYPE_STALENESS})
}
