// Package config reads lbd's configuration file. Every field is documented in
// examples/lbd.yaml; unknown fields are errors, so a typo never silently falls back to a
// default.
package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"

	"github.com/lbd-dev/lbd/daemon/store"
	"sigs.k8s.io/yaml"
)

// Config is lbd's configuration.
type Config struct {
	Log Log `json:"log"`
	// StateDir holds the desired-state file (state.pb).
	StateDir string `json:"state_dir"`
	API      API    `json:"api"`
	// Roles this node plays: "lb", "backend"; empty runs the control plane only.
	Roles  []string     `json:"roles"`
	Limits store.Limits `json:"limits"`
}

// Log configures logging.
type Log struct {
	// Level: trace, debug, info, warn, error.
	Level string `json:"level"`
	// JSON writes one JSON object per line instead of text.
	JSON bool `json:"json"`
}

// API configures the gRPC listeners.
type API struct {
	// Socket is the Unix socket path (mode 0600); empty disables it.
	Socket string `json:"socket"`
	TCP    TCP    `json:"tcp"`
}

// TCP configures the optional TCP listener, which only speaks mutual TLS.
type TCP struct {
	// Listen is host:port; empty disables the listener.
	Listen       string `json:"listen"`
	CertFile     string `json:"cert_file"`
	KeyFile      string `json:"key_file"`
	ClientCAFile string `json:"client_ca_file"`
}

// Default returns the configuration used when no file is given.
func Default() Config {
	return Config{
		Log:      Log{Level: "info"},
		StateDir: "/var/lib/lbd",
		API:      API{Socket: "/run/lbd/lbd.sock"},
		Limits:   store.DefaultLimits(),
	}
}

// Load reads a configuration file over the defaults. Unknown fields are errors.
func Load(path string) (Config, error) {
	c := Default()
	data, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("read config: %w", err)
	}
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return c, fmt.Errorf("parse config %s: %w", path, err)
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Roles lbd knows.
const (
	RoleLB      = "lb"
	RoleBackend = "backend"
)

// Validate checks the configuration as a whole.
func (c Config) Validate() error {
	var errs []error
	if !slices.Contains([]string{"trace", "debug", "info", "warn", "error"}, c.Log.Level) {
		errs = append(errs, fmt.Errorf("log.level: %q is not one of trace, debug, info, warn, error", c.Log.Level))
	}
	if c.StateDir == "" || !filepath.IsAbs(c.StateDir) {
		errs = append(errs, fmt.Errorf("state_dir: %q must be an absolute path", c.StateDir))
	}
	if c.API.Socket == "" && c.API.TCP.Listen == "" {
		errs = append(errs, errors.New("api: neither socket nor tcp.listen is set: the API would be unreachable"))
	}
	if c.API.Socket != "" && !filepath.IsAbs(c.API.Socket) {
		errs = append(errs, fmt.Errorf("api.socket: %q must be an absolute path", c.API.Socket))
	}
	if t := c.API.TCP; t.Listen != "" {
		if _, _, err := net.SplitHostPort(t.Listen); err != nil {
			errs = append(errs, fmt.Errorf("api.tcp.listen: %q is not host:port", t.Listen))
		}
		if t.CertFile == "" || t.KeyFile == "" || t.ClientCAFile == "" {
			errs = append(errs, errors.New("api.tcp: the TCP listener requires cert_file, key_file and client_ca_file (mutual TLS only)"))
		}
	}
	seen := map[string]bool{}
	for _, r := range c.Roles {
		if r != RoleLB && r != RoleBackend {
			errs = append(errs, fmt.Errorf("roles: %q is not lb or backend", r))
		}
		if seen[r] {
			errs = append(errs, fmt.Errorf("roles: %q given twice", r))
		}
		seen[r] = true
	}
	if err := c.Limits.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("limits: %w", err))
	}
	return errors.Join(errs...)
}
