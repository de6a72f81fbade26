package authz

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"time"
)

// Reload triggers, as the audit trail records them.
const (
	TriggerSignal = "SIGHUP"
	TriggerFile   = "file-change"
)

// Reloader puts a changed policy file in force without a restart: on SIGHUP, and when
// the file's content changes (checked every Interval). A file that does not load leaves
// the policy in force as it was.
type Reloader struct {
	Guard *Guard
	// Path is the policy file; empty reloads nothing.
	Path string
	// Self is lbd's uid (Load).
	Self     uint32
	Interval time.Duration
	// OnReload is told of every attempt: the policy put in force, or the error.
	OnReload func(trigger string, p *Policy, err error)
}

// Reload loads the file and puts it in force.
func (r *Reloader) Reload(trigger string) error {
	p, err := Load(r.Path, r.Self)
	if err == nil {
		r.Guard.Swap(p)
	}
	if r.OnReload != nil {
		r.OnReload(trigger, p, err)
	}
	return err
}

// Run reloads on every value from hup and on content changes until ctx ends.
func (r *Reloader) Run(ctx context.Context, hup <-chan os.Signal) {
	var tick <-chan time.Time
	if r.Path != "" && r.Interval > 0 {
		t := time.NewTicker(r.Interval)
		defer t.Stop()
		tick = t.C
	}
	// failed is the content (or read error) of the last attempt that failed: it is
	// reported once, not at every tick.
	failed := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			if r.Path != "" {
				r.Reload(TriggerSignal)
			}
		case <-tick:
			data, err := os.ReadFile(r.Path)
			state := ""
			if err != nil {
				state = err.Error()
			} else {
				sum := sha256.Sum256(data)
				state = hex.EncodeToString(sum[:])
			}
			if state == r.Guard.Policy().Digest || state == failed {
				continue
			}
			failed = ""
			if r.Reload(TriggerFile) != nil {
				failed = state
			}
		}
	}
}
