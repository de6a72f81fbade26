package config

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"time"

	"github.com/lbd-dev/lbd/daemon/authz"
)

// Audit configures the audit trail.
type Audit struct {
	// File is the trail, one JSON object per line; empty writes the records to lbd's
	// log instead (the journal, under systemd).
	File string `json:"file"`
	// MaxSizeMB rotates the file when it reaches this size.
	MaxSizeMB int `json:"max_size_mb"`
	// MaxBackups is how many rotated files are kept; 0 keeps them all.
	MaxBackups int `json:"max_backups"`
	// MaxAgeDays removes rotated files older than this; 0 never does.
	MaxAgeDays int `json:"max_age_days"`
}

// RateLimit bounds the calls of each principal (a client certificate's identity, a
// uid on the socket); a call above it is refused with RESOURCE_EXHAUSTED. Root and
// lbd's user on the socket are not limited.
type RateLimit struct {
	// Rate is the calls per second a principal may keep up (a stream counts when it
	// opens); 0 disables the limit.
	Rate float64 `json:"rate"`
	// Burst is how many calls a principal may make at once.
	Burst int `json:"burst"`
	// MaxOpen is how many calls (unary calls and streams) a principal may have open at
	// once; 0 disables the limit.
	MaxOpen int `json:"max_open"`
	// MaxStreams is how many streams (watches) a principal may have open at once; each
	// holds a snapshot of the services until its client has read it. 0 disables the
	// limit.
	MaxStreams int `json:"max_streams"`
}

// Defaults of the API's limits.
const (
	defaultMaxWatchers          = 256
	defaultMaxConcurrentStreams = 100
	defaultMaxRecvMsgBytes      = 16 << 20
	defaultMaxOpen              = 64
	defaultMaxStreams           = 16
)

func defaultAPI() API {
	return API{
		Socket:               "/run/lbd/lbd.sock",
		SocketMode:           "0600",
		MaxWatchers:          defaultMaxWatchers,
		PolicyCheckInterval:  Duration(5 * time.Second),
		Audit:                Audit{MaxSizeMB: 100, MaxBackups: 10},
		RateLimit:            RateLimit{Rate: 200, Burst: 400, MaxOpen: defaultMaxOpen, MaxStreams: defaultMaxStreams},
		MaxConcurrentStreams: defaultMaxConcurrentStreams,
		MaxRecvMsgBytes:      defaultMaxRecvMsgBytes,
		StreamSendTimeout:    Duration(30 * time.Second),
		KeepaliveMinTime:     Duration(10 * time.Second),
	}
}

// SocketPerm returns the socket's mode and group (-1: lbd's own).
func (a API) SocketPerm() (os.FileMode, int, error) {
	m, err := strconv.ParseUint(a.SocketMode, 8, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("api.socket_mode: %q is not an octal mode like \"0600\" or \"0660\"", a.SocketMode)
	}
	mode := os.FileMode(m)
	if mode&^0o770 != 0 || mode&0o600 != 0o600 {
		return 0, 0, fmt.Errorf("api.socket_mode: %s must give lbd's user read and write and others nothing (0600, 0620, 0660, ...)", a.SocketMode)
	}
	gid := -1
	if a.SocketGroup != "" {
		if n, err := strconv.ParseUint(a.SocketGroup, 10, 32); err == nil {
			gid = int(n)
		} else if g, err := user.LookupGroup(a.SocketGroup); err != nil {
			return 0, 0, fmt.Errorf("api.socket_group: %w", err)
		} else if gid, err = strconv.Atoi(g.Gid); err != nil {
			return 0, 0, fmt.Errorf("api.socket_group: gid %q: %w", g.Gid, err)
		}
	}
	return mode, gid, nil
}

// validateSecurity checks the socket's permissions, the policy file and the limits.
func (a API) validateSecurity() []error {
	var errs []error
	if a.Socket != "" {
		if _, _, err := a.SocketPerm(); err != nil {
			errs = append(errs, err)
		}
	}
	if a.PolicyFile != "" {
		if _, err := authz.Load(a.PolicyFile, uint32(os.Geteuid())); err != nil {
			errs = append(errs, fmt.Errorf("api.policy_file: %w", err))
		}
	}
	if a.PolicyCheckInterval < 0 {
		errs = append(errs, errors.New("api.policy_check_interval: must not be negative"))
	}
	if a.Audit.MaxSizeMB < 1 {
		errs = append(errs, fmt.Errorf("api.audit.max_size_mb: must be at least 1, got %d", a.Audit.MaxSizeMB))
	}
	if a.Audit.MaxBackups < 0 || a.Audit.MaxAgeDays < 0 {
		errs = append(errs, errors.New("api.audit: max_backups and max_age_days must not be negative"))
	}
	if a.RateLimit.Rate < 0 {
		errs = append(errs, fmt.Errorf("api.rate_limit.rate: must not be negative, got %g", a.RateLimit.Rate))
	}
	if a.RateLimit.Rate > 0 && a.RateLimit.Burst < 1 {
		errs = append(errs, fmt.Errorf("api.rate_limit.burst: must be at least 1 with a rate, got %d", a.RateLimit.Burst))
	}
	if a.RateLimit.MaxOpen < 0 {
		errs = append(errs, fmt.Errorf("api.rate_limit.max_open: must not be negative, got %d", a.RateLimit.MaxOpen))
	}
	if a.RateLimit.MaxStreams < 0 {
		errs = append(errs, fmt.Errorf("api.rate_limit.max_streams: must not be negative, got %d", a.RateLimit.MaxStreams))
	}
	if a.MaxConcurrentStreams < 1 {
		errs = append(errs, errors.New("api.max_concurrent_streams: must be at least 1"))
	}
	if a.MaxRecvMsgBytes < 1<<10 {
		errs = append(errs, fmt.Errorf("api.max_recv_msg_bytes: must be at least 1024, got %d", a.MaxRecvMsgBytes))
	}
	if a.StreamSendTimeout < 0 {
		errs = append(errs, errors.New("api.stream_send_timeout: must not be negative"))
	}
	if a.KeepaliveMinTime < 0 {
		errs = append(errs, errors.New("api.keepalive_min_time: must not be negative"))
	}
	return errs
}
