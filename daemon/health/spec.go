package health

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// Kind is the type of probe a target gets.
type Kind uint8

const (
	// KindNone disables probing: the target is always UP.
	KindNone Kind = iota
	// KindTCP opens a TCP connection and closes it at once.
	KindTCP
	// KindHTTP sends a GET over plain HTTP/1.1 and checks the status code.
	KindHTTP
	// KindHTTPS sends a GET over HTTP/1.1 in TLS and checks the status code.
	KindHTTPS
)

func (k Kind) String() string {
	switch k {
	case KindNone:
		return "none"
	case KindTCP:
		return "tcp"
	case KindHTTP:
		return "http"
	case KindHTTPS:
		return "https"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Initial is the state a newly added target starts in.
type Initial uint8

const (
	// InitialUnknown (the default) starts a target UNKNOWN, which counts as
	// usable. The first successful probe makes it UP; `Fall` consecutive failures
	// make it DOWN, the same bar as for an UP target.
	//
	// It is the default because the daemon re-adds every backend when it
	// restarts: starting pessimistic would empty every Maglev table and withdraw
	// every VIP for Rise×Interval after each restart or upgrade, which the design
	// forbids. It also matches what HAProxy (servers start up), Envoy and NGINX
	// (without "mandatory") do by default.
	InitialUnknown Initial = iota
	// InitialDown starts a target DOWN: it carries traffic only after `Rise`
	// consecutive successful probes, like a Kubernetes readiness probe or
	// HAProxy's "init-state fully-down". Suits backends that are added before
	// they are ready to serve.
	InitialDown
)

func (i Initial) String() string {
	switch i {
	case InitialUnknown:
		return "unknown"
	case InitialDown:
		return "down"
	}
	return fmt.Sprintf("initial(%d)", uint8(i))
}

// Defaults filled in by Spec.WithDefaults. They follow HAProxy's (inter 2s,
// rise 2, fall 3), with a timeout shorter than the interval so a hung backend
// never delays the next probe.
const (
	DefaultInterval  = 2 * time.Second
	DefaultTimeout   = time.Second
	DefaultRise      = 2
	DefaultFall      = 3
	DefaultPath      = "/"
	DefaultStatusMin = 200
	DefaultStatusMax = 399
)

// MinInterval bounds the probe rate of a single target, and so the cost of
// the whole checker (its CPU is proportional to the sum of 1/Interval).
const MinInterval = 10 * time.Millisecond

// Spec describes how one target is probed and judged.
type Spec struct {
	Kind Kind
	// Port overrides the target's port for the probe; 0 probes the target's
	// own port.
	Port uint16
	// Path is the HTTP(S) request path (default "/").
	Path string
	// Host is sent as the HTTP Host header and, for HTTPS, as SNI and the name
	// the certificate is verified against. Empty sends the address.
	Host string
	// InsecureSkipVerify accepts any server certificate (HTTPS only).
	InsecureSkipVerify bool
	// StatusMin and StatusMax bound the accepted HTTP status codes, inclusive
	// (default 200-399). Redirects are not followed: a 3xx is judged as is.
	StatusMin, StatusMax int
	// Interval is the time between probes of one target; each gap is
	// jittered by ±10%.
	Interval time.Duration
	// Timeout bounds one probe, connection and TLS handshake included. It
	// must not exceed Interval.
	Timeout time.Duration
	// Rise is the number of consecutive successes that bring a DOWN target
	// UP; Fall the number of consecutive failures that bring a target DOWN.
	Rise, Fall int
	// Initial is the state of a target when it is first added.
	Initial Initial
}

// WithDefaults returns s with every zero field that matters for its Kind set to
// its default.
func (s Spec) WithDefaults() Spec {
	if s.Kind == KindNone {
		return s
	}
	if s.Interval == 0 {
		s.Interval = DefaultInterval
	}
	if s.Timeout == 0 {
		s.Timeout = min(DefaultTimeout, s.Interval)
	}
	if s.Rise == 0 {
		s.Rise = DefaultRise
	}
	if s.Fall == 0 {
		s.Fall = DefaultFall
	}
	if s.Kind == KindHTTP || s.Kind == KindHTTPS {
		if s.Path == "" {
			s.Path = DefaultPath
		}
		if s.StatusMin == 0 && s.StatusMax == 0 {
			s.StatusMin, s.StatusMax = DefaultStatusMin, DefaultStatusMax
		}
	}
	return s
}

// Validate reports the first problem with s. Call it on the result of
// WithDefaults: zero values are not valid for an active probe.
func (s Spec) Validate() error {
	switch s.Kind {
	case KindNone:
		return nil
	case KindTCP, KindHTTP, KindHTTPS:
	default:
		return fmt.Errorf("unknown probe kind %d", uint8(s.Kind))
	}
	if s.Interval < MinInterval {
		return fmt.Errorf("interval %v is below the minimum %v", s.Interval, MinInterval)
	}
	if s.Timeout <= 0 || s.Timeout > s.Interval {
		return fmt.Errorf("timeout %v must be positive and at most the interval %v", s.Timeout, s.Interval)
	}
	if s.Rise < 1 || s.Fall < 1 {
		return fmt.Errorf("rise %d and fall %d must be at least 1", s.Rise, s.Fall)
	}
	if s.Initial > InitialDown {
		return fmt.Errorf("unknown initial state %d", uint8(s.Initial))
	}
	if s.Kind == KindTCP {
		if s.Path != "" || s.Host != "" || s.InsecureSkipVerify || s.StatusMin != 0 || s.StatusMax != 0 {
			return errors.New("path, host, status range and skip-verify apply only to http and https probes")
		}
		return nil
	}
	if !strings.HasPrefix(s.Path, "/") || strings.ContainsAny(s.Path, " \t\r\n#") {
		return fmt.Errorf("path %q must start with / and contain no space or fragment", s.Path)
	}
	if strings.ContainsAny(s.Host, " \t\r\n/") {
		return fmt.Errorf("host %q contains a space or slash", s.Host)
	}
	if s.StatusMin < 100 || s.StatusMax > 599 || s.StatusMin > s.StatusMax {
		return fmt.Errorf("status range %d-%d must lie within 100-599", s.StatusMin, s.StatusMax)
	}
	if s.InsecureSkipVerify && s.Kind != KindHTTPS {
		return errors.New("skip-verify applies only to https probes")
	}
	return nil
}

// sameProbe reports whether a and b send the same probe and judge it the same
// way. Results of one probe say nothing about the other.
func (s Spec) sameProbe(o Spec) bool {
	return s.Kind == o.Kind && s.Port == o.Port && s.Path == o.Path && s.Host == o.Host &&
		s.InsecureSkipVerify == o.InsecureSkipVerify &&
		s.StatusMin == o.StatusMin && s.StatusMax == o.StatusMax
}

// Target is one thing to probe.
type Target struct {
	// Key identifies the target across calls to Checker.Set; a target whose
	// key is kept keeps its state. The daemon uses the backend key (e.g.
	// "198.18.0.10:80").
	Key string
	// Addr is the backend address and port.
	Addr netip.AddrPort
	Spec Spec
}

// probeAddr is the address the probe connects to.
func (t Target) probeAddr() netip.AddrPort {
	if t.Spec.Port != 0 {
		return netip.AddrPortFrom(t.Addr.Addr(), t.Spec.Port)
	}
	return t.Addr
}

func (t Target) validate() error {
	if t.Key == "" {
		return errors.New("empty target key")
	}
	if !t.Addr.Addr().IsValid() {
		return fmt.Errorf("target %q: invalid address", t.Key)
	}
	if t.Spec.Kind != KindNone && t.probeAddr().Port() == 0 {
		return fmt.Errorf("target %q: no port to probe", t.Key)
	}
	if err := t.Spec.Validate(); err != nil {
		return fmt.Errorf("target %q: %w", t.Key, err)
	}
	return nil
}
