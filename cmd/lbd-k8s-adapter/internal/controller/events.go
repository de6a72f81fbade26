package controller

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/config"
	corev1 "k8s.io/api/core/v1"
)

// maxNamed bounds how many VIP × port an Event names.
const maxNamed = 8

// programmedEvents records, on every replica, an Event when its lbd has programmed a
// Service's VIPs and ports (again when they change), and when lbd fails to: `kubectl
// describe svc` then shows which LB nodes serve the Service and what went wrong.
type programmedEvents struct {
	c      *controller
	runner *Runner
	// last is, per Service, what was last seen: "" while not programmed, else the
	// programmed VIP × port, or "error: ..." when lbd failed.
	last map[string]string
	// started is true once the state seen at start has been recorded: what was programmed
	// before the adapter started is not news.
	started bool
	// since is when the adapter started, to the second (Service creation times are): a
	// Service created since then is news even in the first pass, which may run only
	// after lbd has programmed it.
	since time.Time
}

func newProgrammedEvents(c *controller, cfg *config.Config) *programmedEvents {
	e := &programmedEvents{c: c, last: map[string]string{}, since: time.Now().Truncate(time.Second)}
	e.runner = NewRunner(e.once, cfg.Sync.MinInterval.Duration, cfg.Sync.MaxInterval.Duration)
	return e
}

func (e *programmedEvents) once(context.Context) error {
	if !e.c.state.known() {
		return nil // lbd's state is not yet this adapter's, or not yet read
	}
	seen := map[string]string{}
	for _, key := range e.c.state.keys() {
		p := e.c.state.snapshot(key).progress
		now := ""
		switch {
		case len(p.errors) > 0:
			now = "error: " + strings.Join(p.errors, "; ")
		case p.complete():
			now = named(p.done)
		}
		seen[key] = now
		if now == e.last[key] || now == "" {
			continue
		}
		svc := e.c.service(key)
		if svc == nil || !e.started && svc.CreationTimestamp.Time.Before(e.since) {
			continue
		}
		if strings.HasPrefix(now, "error: ") {
			e.c.recorder.Event(svc, corev1.EventTypeWarning, "ProgrammingFailed",
				fmt.Sprintf("lbd on %s failed to program %s", e.c.identity, strings.TrimPrefix(now, "error: ")))
			continue
		}
		e.c.recorder.Event(svc, corev1.EventTypeNormal, "Programmed", fmt.Sprintf("lbd on %s serves %s", e.c.identity, now))
	}
	e.last, e.started = seen, true
	return nil
}

// named lists at most maxNamed entries.
func named(s []string) string {
	if len(s) <= maxNamed {
		return strings.Join(s, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(s[:maxNamed], ", "), len(s)-maxNamed)
}
