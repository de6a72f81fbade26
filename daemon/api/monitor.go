package api

import (
	"errors"
	"slices"
	"strings"

	"github.com/lbd-dev/lbd/daemon/monitor"
	"github.com/lbd-dev/lbd/daemon/servicematch"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// MonitorDatapath implements lbdv1.LoadBalancerServiceServer: the packets the datapath
// reports, as the request filters them, until the client hangs up or lbd stops.
func (s *Server) MonitorDatapath(r *lbdv1.MonitorDatapathRequest, stream lbdv1.LoadBalancerService_MonitorDatapathServer) error {
	if s.opts.Monitor == nil {
		return unimplemented("MonitorDatapath")
	}
	f, err := monitorFilter(r, s.opts.Monitor.Reasons())
	if err != nil {
		return err
	}
	l, err := s.opts.Monitor.Listen(f)
	if err != nil {
		if errors.Is(err, monitor.ErrTooMany) {
			return status.Errorf(codes.ResourceExhausted, "%v: close one and try again", err)
		}
		// The datapath still opening answers UNAVAILABLE.
		if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown {
			return st.Err()
		}
		return status.Errorf(codes.FailedPrecondition, "monitor: %v", err)
	}
	defer l.Close()
	for {
		select {
		case it := <-l.Events():
			if err := stream.Send(&lbdv1.MonitorDatapathResponse{Event: it.Event, LostEvents: it.Lost}); err != nil {
				return err
			}
		case <-s.stopping:
			return status.Error(codes.Unavailable, "lbd is shutting down; monitor again when it is back")
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
	}
}

// monitorFilter checks a request's filter: every reason one of reasons (or
// monitor.Forwarded), service patterns valid.
func monitorFilter(r *lbdv1.MonitorDatapathRequest, reasons []string) (monitor.Filter, error) {
	f := monitor.Filter{Reasons: r.GetReasons(), DropsOnly: r.GetDropsOnly(), Forwarded: r.GetForwarded()}
	for i, reason := range f.Reasons {
		if reason == monitor.Forwarded {
			f.Forwarded = true
			continue
		}
		if !slices.Contains(reasons, reason) {
			return f, status.Errorf(codes.InvalidArgument, "reasons[%d]: %q is not a reason; the reasons are %s and %s",
				i, reason, strings.Join(reasons, ", "), monitor.Forwarded)
		}
	}
	sel, err := servicematch.Compile(r.GetServices())
	if err != nil {
		return f, status.Errorf(codes.InvalidArgument, "services%v", err)
	}
	f.Services = sel
	if f.DropsOnly && f.Forwarded {
		return f, status.Error(codes.InvalidArgument, "drops_only: forwarded packets are not drops; ask for one or the other")
	}
	return f, nil
}
