package lbd

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/sdnotify"
	"github.com/lbd-dev/lbd/daemon/store"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// notifySystemd runs the systemd notify protocol until ctx ends (package sdnotify): READY=1
// once ready() says the node is, and WATCHDOG=1 while the daemon's own parts answer.
// It is started once the API listens, so that a unit ordered after lbd's finds the socket.
//
// The watchdog asks for what a hung daemon cannot give: its loops still run, the store
// answers, and the API answers a health check on its own socket. It does not ask for
// readiness (a node detached on purpose must not be restarted, which would attach it
// again) nor for the datapath's lock, which a sync of many services holds for seconds.
func notifySystemd(ctx context.Context, n *sdnotify.Notifier, log hclog.Logger, ready sdnotify.Ready,
	st *store.Store, stopped *stoppedLoops, socket string) {
	checks := []check{
		{"loops", func(context.Context) error { return stopped.err() }},
		{"store", func(context.Context) error { st.Counts(); return nil }},
	}
	if socket != "" && n.Watchdog() > 0 {
		conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			log.Error("cannot check the API for the systemd watchdog", "op", "watchdog", "error", err)
		} else {
			defer conn.Close()
			health := healthpb.NewHealthClient(conn)
			// Any answer will do: NOT_SERVING is a node that is not ready, not a daemon that hangs.
			checks = append(checks, check{"api", func(ctx context.Context) error {
				_, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
				return err
			}})
		}
	}
	n.Run(ctx, ready, func(ctx context.Context) error {
		for _, c := range checks {
			if err := c.answer(ctx); err != nil {
				return err
			}
		}
		return nil
	})
}

// stoppedLoops records the daemon's loops that ended with an error before shutdown.
type stoppedLoops struct {
	mu   sync.Mutex
	errs []error
}

func (s *stoppedLoops) add(loop string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errs = append(s.errs, fmt.Errorf("%s stopped: %w", loop, err))
}

func (s *stoppedLoops) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(s.errs...)
}

// check is one part of the daemon that must answer for the watchdog to be fed.
type check struct {
	name string
	fn   func(context.Context) error
}

// answer runs the check and gives up when ctx ends, even if the check itself ignores ctx
// (a part stuck on its lock): the watchdog then goes unfed and systemd restarts lbd.
func (c check) answer(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- c.fn(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s does not answer: %w", c.name, ctx.Err())
	}
}
