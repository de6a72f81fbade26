package lbctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// drainPollInterval is how often drain --wait counts the backend's flows.
const drainPollInterval = time.Second

func (a *app) backendDrainCommand() *cobra.Command {
	const (
		draining = lbdv1.BackendState_BACKEND_STATE_DRAINING
		disabled = lbdv1.BackendState_BACKEND_STATE_DISABLED
	)
	cmd := &cobra.Command{
		Use:   "drain SERVICE ADDR:PORT [--wait [--timeout D]]",
		Short: "Stop sending new flows to a backend; established flows stay",
		Long: `Stop sending new flows to a backend; established flows stay on it until they end.

With --wait, lbctl then counts the backend's open flows on the node it talks to (the
conntrack entries of an LB node, the NAT entries of a backend node) every second,
prints the count whenever it changes, and returns once none is left: then the backend
can be removed without cutting a connection. A flow counts as ended once it saw a FIN
or RST. --timeout bounds the wait (by default it has no bound); when it passes with
flows left, lbctl says how many and exits 1. A backend that is already draining is
waited for all the same.`,
		Example: `  lbctl backend drain web 198.18.1.10:8080 --wait --timeout 10m && \
    lbctl backend remove web 198.18.1.10:8080`,
		Args:              exactArgs("SERVICE", "ADDR:PORT"),
		ValidArgsFunction: a.completeArgs(a.completeServices, a.completeBackends),
	}
	cmd.Flags().BoolVar(&a.waiting, "wait", false, "return only once the backend has no open flow left on this node, printing their count as it falls")
	cmd.RunE = a.run(func(ctx context.Context, _ *cobra.Command, args []string) error {
		err := a.setBackendState(ctx, "drain", args[0], args[1], draining, draining, disabled)
		var refused *stateRefusedError
		if !a.waiting || err != nil && !(errors.As(err, &refused) && refused.state == draining) {
			return err
		}
		if err != nil && a.opts.output != "table" {
			// Already draining: JSON and YAML print the backend as it is.
			if err := a.printBackend(ctx, args[0], args[1]); err != nil {
				return err
			}
		}
		if a.opts.output != "table" {
			// JSON and YAML print the backend once drained, and only then.
			return a.waitDrained(ctx, args[0], args[1])
		}
		if err := a.flush(); err != nil {
			return err
		}
		return a.waitDrained(ctx, args[0], args[1])
	})
	return cmd
}

// waitDrained polls the count of the backend's open flows until it is zero.
func (a *app) waitDrained(ctx context.Context, service, addrPort string) error {
	ap, err := parseAddrPort(addrPort)
	if err != nil {
		return err
	}
	lb, err := a.lb()
	if err != nil {
		return err
	}
	req := &lbdv1.ListConnectionsRequest{
		BackendAddress: ap.Addr().String(), BackendPort: uint32(ap.Port()),
		OpenOnly: true, CountOnly: true,
	}
	start := a.now()
	last := int64(-1)
	tick := time.NewTicker(drainPollInterval)
	defer tick.Stop()
	for {
		resp, err := lb.ListConnections(ctx, req)
		if err != nil {
			// lbd, told the deadline, may end the call a moment before ctx expires.
			if ctx.Err() != nil || status.Code(err) == codes.DeadlineExceeded {
				return a.drainTimedOut(ap.String(), service, last)
			}
			return err
		}
		n := int64(resp.MatchedCount)
		if n != last && a.opts.output == "table" {
			fmt.Fprintf(&a.out, "%s backend %s of service %q: %d open flow(s)\n",
				a.now().UTC().Format("15:04:05"), ap, service, n)
			if err := a.flush(); err != nil {
				return err
			}
		}
		last = n
		if n == 0 {
			if a.opts.output == "table" {
				fmt.Fprintf(&a.out, "backend %s of service %q drained after %v\n", ap, service, a.now().Sub(start).Round(100*time.Millisecond))
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return a.drainTimedOut(ap.String(), service, last)
		case <-tick.C:
		}
	}
}

func (a *app) drainTimedOut(ap, service string, left int64) error {
	if left < 0 {
		return fmt.Errorf("backend %s of service %q: no flow count within --timeout %v", ap, service, a.opts.timeout)
	}
	return fmt.Errorf("backend %s of service %q still has %d open flow(s) after --timeout %v", ap, service, left, a.opts.timeout)
}

// printBackend prints a backend as "backend get" would.
func (a *app) printBackend(ctx context.Context, service, addrPort string) error {
	ap, err := parseAddrPort(addrPort)
	if err != nil {
		return err
	}
	lb, err := a.lb()
	if err != nil {
		return err
	}
	resp, err := lb.GetBackend(ctx, &lbdv1.GetBackendRequest{ServiceName: service, Address: ap.Addr().String(), Port: uint32(ap.Port())})
	if err != nil {
		return err
	}
	return a.print(resp.Backend, func(io.Writer) {})
}
