package api

import (
	"context"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// StaleHeader is the response header of every unary call answered while the node's
// services may be behind its fleet's (the etcd store cannot be reached, or has not been
// read since the node started): its value says why, and as of when.
const StaleHeader = "lbd-stale"

// UnaryInterceptor states the staleness of what the node serves (StaleHeader).
func (s *Server) UnaryInterceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if r := s.st.Stale(); r != "" {
		// A header value is printable ASCII.
		r = strings.Map(func(c rune) rune {
			if c < 0x20 || c > 0x7e {
				return '?'
			}
			return c
		}, r)
		_ = grpc.SetHeader(ctx, metadata.Pairs(StaleHeader, r))
	}
	return handler(ctx, req)
}
