package lbctl

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// deadlineMonitor sends one event, then ends the stream as lbd does when the deadline
// lbctl sent it passes: DEADLINE_EXCEEDED, which can reach lbctl a moment before its
// own context expires.
type deadlineMonitor struct {
	lbdv1.UnimplementedLoadBalancerServiceServer
}

func (deadlineMonitor) MonitorDatapath(_ *lbdv1.MonitorDatapathRequest, s lbdv1.LoadBalancerService_MonitorDatapathServer) error {
	ev := &lbdv1.MonitorEvent{Time: timestamppb.Now(), Reason: "backend_drop_bad_geneve", Verdict: "TCX_DROP",
		Hook: "tc-ingress", Interface: "eth0", Length: 116}
	if err := s.Send(&lbdv1.MonitorDatapathResponse{Event: ev}); err != nil {
		return err
	}
	return status.Error(codes.DeadlineExceeded, "context deadline exceeded")
}

// TestMonitorEndsAtTimeout: with --timeout, lbd ending the stream at the deadline is
// the normal end of the monitor (exit 0), as it is for a watch, whether or not lbctl's
// own context has expired yet; the event before it is printed with its hook.
func TestMonitorEndsAtTimeout(t *testing.T) {
	dir, err := os.MkdirTemp("", "lbctl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "lbd.sock")
	g := grpc.NewServer()
	lbdv1.RegisterLoadBalancerServiceServer(g, deadlineMonitor{})
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(l)
	t.Cleanup(g.Stop)

	out := ok(t, "unix://"+sock, "--timeout", "1m", "monitor")
	if want := "  backend_drop_bad_geneve  TCX_DROP  tc-ingress eth0  (headers not decoded)  116 bytes\n"; !strings.HasSuffix(out, want) {
		t.Errorf("lbctl monitor printed %q, want a line ending %q", out, want)
	}
}
