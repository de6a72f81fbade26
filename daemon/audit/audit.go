// Package audit keeps lbd's audit trail: one JSON line for every call that changes state
// or was refused, and for every policy reload, written to a file rotated by size or to
// the daemon's log (the journal, under systemd); and the API's request counters.
package audit

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"gopkg.in/natefinch/lumberjack.v2"
)

// Record is one line of the audit trail.
type Record struct {
	Time time.Time `json:"time"`
	// Principal is who called ("unix:uid:N", a certificate's names) or what reloaded the
	// policy ("SIGHUP", "file-change", "start").
	Principal string `json:"principal"`
	// Transport is "unix" or "tcp"; empty for a policy reload.
	Transport string `json:"transport,omitempty"`
	// Method is the RPC ("lbd.v1.LoadBalancerService/DeleteService") or "policy.reload".
	Method string `json:"method"`
	// Owner is the owner of the services the call touched (as the request names it, or
	// as stored before the call).
	Owner string `json:"owner,omitempty"`
	// Services and Backends ("address:port") are what the call touched; at most
	// maxNames of each, the rest counted in Omitted.
	Services []string `json:"services,omitempty"`
	Backends []string `json:"backends,omitempty"`
	Peer     string   `json:"peer,omitempty"`
	Omitted  int      `json:"omitted,omitempty"`
	// Code is the gRPC status code of the answer ("OK", "PermissionDenied", ...).
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
	// Revision is the store's change sequence after the call.
	Revision uint64 `json:"revision,omitempty"`
	// Policy is, for a reload, the policy file and its SHA-256.
	Policy string `json:"policy,omitempty"`
}

// maxNames bounds the names one record lists: an ApplyServices of thousands of
// services is one line, not megabytes.
const maxNames = 100

// Options configure the trail.
type Options struct {
	// File is the trail's path; empty writes the records to Logger instead.
	File string
	// MaxSizeMB is the size at which the file is rotated; MaxBackups how many rotated
	// files are kept (0 keeps all); MaxAgeDays how long (0 keeps them forever).
	MaxSizeMB  int
	MaxBackups int
	MaxAgeDays int
	Logger     hclog.Logger
}

// Log writes records. Safe for concurrent use.
type Log struct {
	mu  sync.Mutex
	w   io.WriteCloser // nil: records go to log
	log hclog.Logger
}

// Open returns the trail that opts describe. The file is created (mode 0600) at the
// first record.
func Open(opts Options) *Log {
	l := &Log{log: opts.Logger}
	if l.log == nil {
		l.log = hclog.NewNullLogger()
	}
	if opts.File != "" {
		l.w = &lumberjack.Logger{Filename: opts.File, MaxSize: opts.MaxSizeMB, MaxBackups: opts.MaxBackups, MaxAge: opts.MaxAgeDays}
	}
	return l
}

// Write appends r. A record that cannot be written is logged as an error with its
// content, so it is not lost without a trace.
func (l *Log) Write(r Record) {
	if r.Time.IsZero() {
		r.Time = time.Now().UTC()
	}
	line, err := json.Marshal(r)
	if err != nil {
		l.log.Error("encode audit record", "op", "audit", "error", err)
		return
	}
	if l.w == nil {
		l.log.Info("audit", "op", "audit", "record", string(line))
		return
	}
	l.mu.Lock()
	_, err = l.w.Write(append(line, '\n'))
	l.mu.Unlock()
	if err != nil {
		l.log.Error("write audit record", "op", "audit", "error", err, "record", string(line))
	}
}

// Close closes the file.
func (l *Log) Close() error {
	if l.w == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.w.Close(); err != nil {
		return fmt.Errorf("close audit file: %w", err)
	}
	return nil
}
