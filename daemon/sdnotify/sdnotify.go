// Package sdnotify speaks systemd's notify protocol (sd_notify(3)) for lbd: READY=1 once
// the node is ready (its datapath attached and in line with the desired state), STATUS=
// lines that follow readiness, WATCHDOG=1 while the daemon's own loops answer, and
// STOPPING=1 at shutdown. Outside systemd (no NOTIFY_SOCKET) it does nothing.
package sdnotify

import (
	"context"
	"fmt"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/hashicorp/go-hclog"
)

// readyPoll is how often readiness is read while waiting for it, statusPoll afterwards
// (the pace gRPC health follows it at).
const (
	readyPoll  = 100 * time.Millisecond
	statusPoll = 500 * time.Millisecond
)

// Ready reports whether the node is ready and why (datapath.Manager.Ready's contract).
type Ready func() (bool, string)

// Alive checks that the daemon still works: it returns an error when one of its loops
// does not answer before ctx ends. The watchdog is fed only while it returns nil.
type Alive func(ctx context.Context) error

// Notifier sends lbd's state to systemd. The zero value is not usable: use New.
type Notifier struct {
	log      hclog.Logger
	send     func(state string) (bool, error)
	watchdog time.Duration // WATCHDOG_USEC; 0: no watchdog
}

// New returns a Notifier for the environment systemd gave the process: NOTIFY_SOCKET and,
// with WatchdogSec=, WATCHDOG_USEC (and WATCHDOG_PID, which must be this process).
func New(log hclog.Logger) (*Notifier, error) {
	wd, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		return nil, fmt.Errorf("systemd watchdog: %w", err)
	}
	return &Notifier{log: log, send: func(s string) (bool, error) { return daemon.SdNotify(false, s) }, watchdog: wd}, nil
}

// Watchdog is the watchdog timeout systemd asked for, 0 when none.
func (n *Notifier) Watchdog() time.Duration { return n.watchdog }

// Run notifies until ctx ends, then sends STOPPING=1. READY=1 goes once, the first time
// ready() says yes; STATUS= follows every change of readiness. With a watchdog, alive()
// runs every half timeout, with a quarter timeout to answer, and only an answer without
// error sends WATCHDOG=1: a daemon whose loops hang is restarted by systemd, while a node
// that is merely not ready (detached on purpose, repairing drift) is left running.
func (n *Notifier) Run(ctx context.Context, ready Ready, alive Alive) {
	if n.watchdog > 0 {
		go n.feed(ctx, alive)
	}
	readySent := false
	lastStatus := ""
	t := time.NewTicker(readyPoll)
	defer t.Stop()
	for {
		ok, why := ready()
		status := "not ready: " + why
		switch {
		case ok:
			status = "ready: " + why
		case !readySent:
			status = "starting: " + why
		}
		if ok && !readySent {
			if n.notify("READY=1\nSTATUS=" + status) {
				n.log.Info("told systemd the node is ready", "op", "start", "status", status)
			}
			readySent = true
			t.Reset(statusPoll)
		} else if status != lastStatus {
			n.notify("STATUS=" + status)
		}
		lastStatus = status
		select {
		case <-ctx.Done():
			n.notify("STOPPING=1\nSTATUS=stopping")
			return
		case <-t.C:
		}
	}
}

// feed sends WATCHDOG=1 every half timeout while alive answers in time.
func (n *Notifier) feed(ctx context.Context, alive Alive) {
	t := time.NewTicker(n.watchdog / 2)
	defer t.Stop()
	for {
		actx, cancel := context.WithTimeout(ctx, n.watchdog/4)
		err := alive(actx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			n.log.Error("not feeding the systemd watchdog", "op", "watchdog", "error", err, "timeout", n.watchdog)
		} else {
			n.notify("WATCHDOG=1")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// notify sends one message and reports whether systemd got it; a failure is logged,
// never fatal: lbd forwards whether or not systemd listens.
func (n *Notifier) notify(state string) bool {
	sent, err := n.send(state)
	if err != nil {
		n.log.Warn("systemd notification failed", "op", "notify", "state", state, "error", err)
	}
	return sent && err == nil
}
