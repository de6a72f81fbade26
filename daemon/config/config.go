// Package config reads lbd's configuration file. Every field is documented in
// examples/lbd.yaml; unknown fields are errors, so a typo never silently falls back to a
// default.
package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lbd-dev/lbd/daemon/advertise"
	"github.com/lbd-dev/lbd/daemon/datapath"
	"github.com/lbd-dev/lbd/daemon/servicematch"
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
	Roles    []string     `json:"roles"`
	Limits   store.Limits `json:"limits"`
	Datapath Datapath     `json:"datapath"`
	// MetricsListen is the host:port of the Prometheus /metrics listener; empty disables it.
	MetricsListen string `json:"metrics_listen"`
	// Metrics chooses what /metrics exports besides the default series, which have no
	// backend label.
	Metrics Metrics `json:"metrics"`
	// BGP configures the embedded BGP speaker; absent, this node advertises nothing.
	BGP *advertise.Config `json:"bgp,omitempty"`
	// Store says where the services live: this node's state file, or the etcd cluster
	// of a fleet of LB nodes.
	Store Store `json:"store"`
}

// Metrics chooses what /metrics exports. By default a node exports node-level series
// (the services counted by state, their backends by health, the LB datapath's totals)
// and, while it holds at most service_series_limit services, 9 series per service;
// none per backend. Per-backend series (lbd_backend_packets_total, _bytes_total,
// _new_flows_total and lbd_backend_health: 4 per backend) are exported only for the
// services chosen here. `lbctl stats` shows every service's and backend's counters
// without them.
type Metrics struct {
	// BackendSeries exports per-backend series for every service: 4 more series per
	// backend (400,000 at 100,000 backends, about 33 MiB per scrape; docs/operations.md).
	BackendSeries bool `json:"backend_series"`
	// BackendSeriesServices exports per-backend series only for the services listed:
	// exact names, or patterns in which * stands for any run of characters
	// ("payments/*"). Empty: none. Not together with backend_series.
	BackendSeriesServices []string `json:"backend_series_services"`
	// ServiceSeriesLimit is the most services that get per-service series (9 each).
	// While the node holds no more services than this, every one gets them; above it,
	// only those service_series_services selects, the first of them by name up to the
	// limit, and lbd_metrics_services_omitted counts the others. 0: no limit, 9 series
	// for every service (90,000 at 10,000 services, about 4.7 MiB per scrape).
	ServiceSeriesLimit int `json:"service_series_limit"`
	// ServiceSeriesServices selects the services that keep their per-service series
	// above service_series_limit: exact names, or patterns in which * stands for any
	// run of characters. Empty: none.
	ServiceSeriesServices []string `json:"service_series_services"`
}

// DefaultServiceSeriesLimit keeps a default scrape under 20,000 series (18,000
// per-service ones at most), and under 2 MiB with service names of up to 60
// characters (docs/operations.md).
const DefaultServiceSeriesLimit = 2000

// Datapath configures the BPF programs of the roles.
type Datapath struct {
	// Interfaces are the uplinks: XDP on LB nodes, TC ingress and egress on backend nodes.
	Interfaces []string `json:"interfaces"`
	// BPFFSDir is this instance's bpffs directory; lbd mounts a bpffs there if needed.
	BPFFSDir string `json:"bpffs_dir"`
	// HashSeed feeds the flow hash; every LB node of a VIP must use the same one.
	HashSeed uint32 `json:"hash_seed"`
	// VNI of the Geneve header (docs/wire-format.md; 2 by default).
	VNI uint32 `json:"vni"`
	// UnderlayV4 and UnderlayV6 are the LB node's outer source addresses; empty takes,
	// per backend node, the source the kernel would use toward it (the route's preferred
	// source, or the address of the interface the packet leaves by).
	UnderlayV4 string `json:"underlay_v4"`
	UnderlayV6 string `json:"underlay_v6"`
	// LBSources are the prefixes a backend node accepts lbd's Geneve from (its LB nodes);
	// Geneve without lbd's option passes to the kernel untouched.
	LBSources []string `json:"lb_sources"`
	// ConntrackSize is the LB conntrack table's size in flows (its maps hold a quarter
	// more, headroom the collector gives back); NATSize the backend's.
	ConntrackSize uint32 `json:"conntrack_size"`
	NATSize       uint32 `json:"nat_size"`
	// ConntrackGuardRate is the flood guard: how many new flows a second each CPU of an
	// LB node records in conntrack. Past it, new flows are still balanced by the Maglev
	// table but get no entry, so that a flood of new sources cannot fill the table. 0
	// turns the guard off.
	ConntrackGuardRate uint32 `json:"conntrack_guard_rate"`
	// GC bounds the garbage collector's adaptive interval.
	GCMinInterval Duration `json:"gc_min_interval"`
	GCMaxInterval Duration `json:"gc_max_interval"`
	// TCPIdleTimeout is how long an established TCP flow may stay idle before the LB
	// nodes forget it; UDPIdleTimeout the same for UDP flows. Backend nodes keep a flow's
	// NAT entry a quarter longer, so it always outlives the LB nodes' entry. Keep both
	// the same on every node, and the TCP one above the clients' and servers' keepalive
	// interval (2 h by default on Linux).
	TCPIdleTimeout Duration `json:"tcp_idle_timeout"`
	UDPIdleTimeout Duration `json:"udp_idle_timeout"`
	// NATIdleTimeout is refused: NAT entries follow TCPIdleTimeout and UDPIdleTimeout.
	NATIdleTimeout Duration `json:"nat_idle_timeout,omitempty"`
	// NATClosingTimeout expires NAT entries of TCP flows that saw a FIN or RST, and of SCTP
	// associations that saw an ABORT, SHUTDOWN or SHUTDOWN COMPLETE.
	NATClosingTimeout Duration `json:"nat_closing_timeout"`
	// SocketLB translates the connections of local processes to services at the socket,
	// on any node (any role, or none): their first packet already goes to a backend.
	SocketLB SocketLB `json:"socket_lb"`
	// Monitor bounds what the datapath (an LB node's XDP program, a backend node's TC
	// programs) reports to `lbctl monitor` while one listens.
	Monitor Monitor `json:"monitor"`
	// VerifyInterval is how often lbd reads its maps and attachments back, compares
	// them with the desired state and repairs what differs (also `lbctl node verify`).
	VerifyInterval Duration `json:"verify_interval"`
	// MemoryBudget bounds the kernel memory of the datapath's maps: those the
	// configuration sizes (conntrack, NAT, ...) plus every service's Maglev table
	// (about 4 bytes per slot: 8.5 KiB for 10 backends, 256 KiB for 65537 slots). A
	// change whose tables would not fit is refused with RESOURCE_EXHAUSTED before any
	// map is created. "auto": a quarter of the machine's memory.
	MemoryBudget ByteSize `json:"memory_budget"`
}

// ByteSize is a byte count written with a binary unit ("512MiB", "8GiB"), a plain
// number of bytes, or "auto" (0) for a default chosen at run time.
type ByteSize uint64

var byteUnits = []struct {
	suffix string
	n      uint64
}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

// UnmarshalJSON parses a size string or a number.
func (b *ByteSize) UnmarshalJSON(data []byte) error {
	var n uint64
	if err := json.Unmarshal(data, &n); err == nil {
		*b = ByteSize(n)
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("size must be like \"512MiB\", \"8GiB\" or \"auto\": %w", err)
	}
	if s == "" || s == "auto" {
		*b = 0
		return nil
	}
	for _, u := range byteUnits {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			v, err := strconv.ParseUint(strings.TrimSpace(num), 10, 64)
			if err != nil || v > ^uint64(0)/u.n {
				return fmt.Errorf("size %q: want a whole number of %s", s, u.suffix)
			}
			*b = ByteSize(v * u.n)
			return nil
		}
	}
	return fmt.Errorf("size %q: want a number with B, KiB, MiB, GiB or TiB, or \"auto\"", s)
}

// MarshalJSON writes the size in its largest exact unit, or "auto".
func (b ByteSize) MarshalJSON() ([]byte, error) {
	if b == 0 {
		return json.Marshal("auto")
	}
	for _, u := range byteUnits {
		if uint64(b)%u.n == 0 {
			return json.Marshal(fmt.Sprintf("%d%s", uint64(b)/u.n, u.suffix))
		}
	}
	return json.Marshal(uint64(b))
}

// SocketLB configures socket-level load balancing (cgroup v2 connect, sendmsg, recvmsg
// and getpeername hooks).
type SocketLB struct {
	// Enabled attaches the socket-level programs.
	Enabled bool `json:"enabled"`
	// Cgroup is the cgroup v2 directory whose processes (descendants included) are
	// translated; empty: the root of the cgroup v2 hierarchy, i.e. every process.
	Cgroup string `json:"cgroup"`
	// Translations is how many translated sockets (per backend they talk to) are kept
	// for the reverse translation of recvmsg and getpeername.
	Translations uint32 `json:"translations"`
}

// Monitor limits the packet monitor (`lbctl monitor`, the MonitorDatapath call). The
// datapath reports nothing while no one listens; while someone does, each CPU reports
// one packet in Sample of those a listener may want, and at most Rate a second (on a
// node with both roles, the XDP and the TC programs each as much).
type Monitor struct {
	// Sample reports one packet in this many (1: every one).
	Sample uint32 `json:"sample"`
	// Rate is how many packets each CPU reports a second at most, in bursts of up to as
	// many; the rest are not reported.
	Rate uint32 `json:"rate"`
}

// Duration is a time.Duration written as a Go duration string ("90s", "1h").
type Duration time.Duration

// UnmarshalJSON parses a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string like \"30s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes a duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// Log configures logging.
type Log struct {
	// Level: trace, debug, info, warn, error.
	Level string `json:"level"`
	// JSON writes one JSON object per line instead of text.
	JSON bool `json:"json"`
}

// API configures the gRPC listeners.
type API struct {
	// Socket is the Unix socket path; empty disables it.
	Socket string `json:"socket"`
	// SocketMode is the socket's permissions, in octal: "0600" (lbd's user only) or
	// "0660" (and the members of socket_group). What a client may do is the policy's.
	SocketMode string `json:"socket_mode"`
	// SocketGroup is the socket's group (name or gid); empty leaves lbd's own.
	SocketGroup string `json:"socket_group"`
	TCP         TCP    `json:"tcp"`
	// PolicyFile is the authorization policy (docs/security.md). Empty: root and lbd's
	// user are admin on the socket, and every TCP client is denied.
	PolicyFile string `json:"policy_file"`
	// PolicyCheckInterval is how often the policy file is checked for a change (SIGHUP
	// reloads it at once); 0 disables the check.
	PolicyCheckInterval Duration `json:"policy_check_interval"`
	// Audit is the audit trail of changing and refused calls.
	Audit Audit `json:"audit"`
	// RateLimit bounds each principal's calls.
	RateLimit RateLimit `json:"rate_limit"`
	// MaxConcurrentStreams bounds the calls one connection has open at once.
	MaxConcurrentStreams uint32 `json:"max_concurrent_streams"`
	// MaxRecvMsgBytes bounds one request message; a larger one is refused with
	// RESOURCE_EXHAUSTED before it is decoded.
	MaxRecvMsgBytes int `json:"max_recv_msg_bytes"`
	// StreamSendTimeout ends a stream (DEADLINE_EXCEEDED) whose client has not read a
	// message for this long; 0 never does.
	StreamSendTimeout Duration `json:"stream_send_timeout"`
	// KeepaliveMinTime is the shortest interval at which clients may send keepalive
	// pings; a client pinging more often is disconnected (GOAWAY).
	KeepaliveMinTime Duration `json:"keepalive_min_time"`
	// MaxWatchers bounds the WatchServices streams open at once (a Kubernetes adapter
	// holds one); one more is refused with RESOURCE_EXHAUSTED.
	MaxWatchers int `json:"max_watchers"`
	// WatchBacklog is how many changes a watcher may fall behind before its stream is
	// ended with RESOURCE_EXHAUSTED (it then watches again and gets a fresh snapshot).
	// 0: four times limits.max_services, room for every service to change and report
	// its datapath status twice while a watcher keeps reading.
	WatchBacklog int `json:"watch_backlog"`
}

// WatchBacklogOrDefault is WatchBacklog, or its default for the limits.
func (c Config) WatchBacklogOrDefault() int {
	if c.API.WatchBacklog > 0 {
		return c.API.WatchBacklog
	}
	return 4 * c.Limits.MaxServices
}

// TCP configures the optional TCP listener, which only speaks mutual TLS.
type TCP struct {
	// Listen is host:port; empty disables the listener.
	Listen string `json:"listen"`
	// CertFile and KeyFile are the server's certificate and key (PEM).
	CertFile string `json:"cert_file"`
	KeyFile  string `json:"key_file"`
	// ClientCAFile is the CA (PEM) that client certificates must chain to.
	ClientCAFile string `json:"client_ca_file"`
}

// Default returns the configuration used when no file is given.
func Default() Config {
	return Config{
		Log:      Log{Level: "info"},
		StateDir: "/var/lib/lbd",
		API:      defaultAPI(),
		Limits:   store.DefaultLimits(),
		Datapath: Datapath{
			BPFFSDir:           "/sys/fs/bpf/lbd",
			HashSeed:           DefaultHashSeed,
			VNI:                2,
			ConntrackSize:      datapath.DefaultConntrackSize,
			ConntrackGuardRate: datapath.DefaultConntrackGuardRate,
			NATSize:            datapath.DefaultNATSize,
			GCMinInterval:      Duration(time.Second),
			GCMaxInterval:      Duration(time.Minute),
			TCPIdleTimeout:     Duration(6 * time.Hour),
			UDPIdleTimeout:     Duration(time.Minute),
			NATClosingTimeout:  Duration(time.Minute),
			SocketLB:           SocketLB{Translations: datapath.DefaultSocketTranslations},
			Monitor:            Monitor{Sample: 1, Rate: 1000},
			VerifyInterval:     Duration(datapath.DefaultVerifyInterval),
		},
		MetricsListen: "127.0.0.1:9310",
		Metrics:       Metrics{ServiceSeriesLimit: DefaultServiceSeriesLimit},
		Store:         Store{Type: StoreFile, Prefix: DefaultStorePrefix, Timeout: Duration(5 * time.Second)},
	}
}

// DefaultHashSeed is the flow-hash seed of every LB node that does not set one.
const DefaultHashSeed = 0x6c626431

// Load reads a configuration file over the defaults. Unknown fields are errors.
func Load(path string) (Config, error) {
	c := Default()
	data, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("read config: %w", err)
	}
	doc, err := checkYAML(data, reflect.TypeOf(c))
	if err != nil {
		return c, fmt.Errorf("parse config %s: %w", path, err)
	}
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return c, fmt.Errorf("parse config %s: %w", path, typeErrorPosition(doc, err))
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
	errs = append(errs, c.API.validateSecurity()...)
	if c.API.MaxWatchers < 1 {
		errs = append(errs, fmt.Errorf("api.max_watchers: must be at least 1, got %d", c.API.MaxWatchers))
	}
	if c.API.WatchBacklog < 0 {
		errs = append(errs, fmt.Errorf("api.watch_backlog: must not be negative, got %d", c.API.WatchBacklog))
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
	if c.MetricsListen != "" {
		if _, _, err := net.SplitHostPort(c.MetricsListen); err != nil {
			errs = append(errs, fmt.Errorf("metrics_listen: %q is not host:port", c.MetricsListen))
		}
	}
	if _, err := servicematch.Compile(c.Metrics.BackendSeriesServices); err != nil {
		errs = append(errs, fmt.Errorf("metrics.backend_series_services%w", err))
	}
	if c.Metrics.ServiceSeriesLimit < 0 {
		errs = append(errs, fmt.Errorf("metrics.service_series_limit: %d is negative: give the most services that get per-service series, or 0 for no limit",
			c.Metrics.ServiceSeriesLimit))
	}
	if _, err := servicematch.Compile(c.Metrics.ServiceSeriesServices); err != nil {
		errs = append(errs, fmt.Errorf("metrics.service_series_services%w", err))
	}
	if c.Metrics.ServiceSeriesLimit == 0 && len(c.Metrics.ServiceSeriesServices) > 0 {
		errs = append(errs, errors.New("metrics.service_series_services: has no effect while metrics.service_series_limit is 0 "+
			"(every service gets per-service series): keep one of the two"))
	}
	if c.Metrics.BackendSeries && len(c.Metrics.BackendSeriesServices) > 0 {
		errs = append(errs, errors.New("metrics.backend_series_services: has no effect while metrics.backend_series is true "+
			"(every service's backends get series): keep one of the two"))
	}
	if c.BGP != nil {
		if err := c.BGP.Validate(); err != nil {
			errs = append(errs, err)
		}
		if !slices.Contains(c.Roles, RoleLB) {
			errs = append(errs, errors.New("bgp: only an LB node (role lb) advertises VIPs"))
		}
	}
	errs = append(errs, c.Store.validate()...)
	errs = append(errs, c.Datapath.validate(len(c.Roles) > 0, slices.Contains(c.Roles, RoleBackend))...)
	return errors.Join(errs...)
}

// DatapathAddrs are the addresses of the datapath's configuration, parsed.
type DatapathAddrs struct {
	// Underlay4 and Underlay6 are underlay_v4 and underlay_v6; not valid when empty.
	Underlay4, Underlay6 netip.Addr
	LBSources            []netip.Prefix
}

// Addrs parses the datapath's addresses: the one place they are parsed, for the
// configuration's validation (which reports the errors, each naming its field) and for
// the daemon, which takes a validated configuration.
func (d Datapath) Addrs() (DatapathAddrs, []error) {
	var out DatapathAddrs
	var errs []error
	for _, u := range []struct {
		field, s string
		v4       bool
		to       *netip.Addr
	}{{"underlay_v4", d.UnderlayV4, true, &out.Underlay4}, {"underlay_v6", d.UnderlayV6, false, &out.Underlay6}} {
		if u.s == "" {
			continue
		}
		a, err := netip.ParseAddr(u.s)
		if err != nil || a.Is4() != u.v4 {
			errs = append(errs, fmt.Errorf("datapath.%s: %q is not an %s address", u.field, u.s, map[bool]string{true: "IPv4", false: "IPv6"}[u.v4]))
			continue
		}
		*u.to = a
	}
	for i, s := range d.LBSources {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("datapath.lb_sources[%d]: %q is not a CIDR prefix", i, s))
			continue
		}
		out.LBSources = append(out.LBSources, p)
	}
	return out, errs
}

func (d Datapath) validate(anyRole, backend bool) []error {
	var errs []error
	if anyRole && len(d.Interfaces) == 0 {
		errs = append(errs, errors.New("datapath.interfaces: a node with a role needs at least one uplink interface"))
	}
	if d.BPFFSDir == "" || !filepath.IsAbs(d.BPFFSDir) {
		errs = append(errs, fmt.Errorf("datapath.bpffs_dir: %q must be an absolute path", d.BPFFSDir))
	}
	if d.VNI >= 1<<24 {
		errs = append(errs, fmt.Errorf("datapath.vni: %d does not fit 24 bits", d.VNI))
	}
	_, addrErrs := d.Addrs()
	errs = append(errs, addrErrs...)
	if backend && len(d.LBSources) == 0 {
		errs = append(errs, errors.New("datapath.lb_sources: a backend node must list the prefixes of its LB nodes (lbd's Geneve from anywhere else is dropped)"))
	}
	if d.ConntrackSize < 1024 || d.NATSize < 1024 {
		errs = append(errs, fmt.Errorf("datapath: conntrack_size (%d) and nat_size (%d) must be at least 1024", d.ConntrackSize, d.NATSize))
	}
	if d.GCMinInterval <= 0 || d.GCMaxInterval < d.GCMinInterval {
		errs = append(errs, fmt.Errorf("datapath: need 0 < gc_min_interval (%v) ≤ gc_max_interval (%v)", time.Duration(d.GCMinInterval), time.Duration(d.GCMaxInterval)))
	}
	if d.VerifyInterval < Duration(100*time.Millisecond) {
		errs = append(errs, fmt.Errorf("datapath.verify_interval: %v must be at least 100ms", time.Duration(d.VerifyInterval)))
	}
	if d.NATIdleTimeout != 0 {
		errs = append(errs, errors.New("datapath.nat_idle_timeout: no longer set on its own; NAT entries live 1.25 × "+
			"datapath.tcp_idle_timeout (UDP: udp_idle_timeout), so that they always outlive the LB nodes' flows: remove it"))
	}
	if d.TCPIdleTimeout < Duration(time.Second) || d.UDPIdleTimeout < Duration(time.Second) {
		errs = append(errs, fmt.Errorf("datapath: tcp_idle_timeout (%v) and udp_idle_timeout (%v) must be at least 1s",
			time.Duration(d.TCPIdleTimeout), time.Duration(d.UDPIdleTimeout)))
	}
	if d.NATClosingTimeout <= 0 {
		errs = append(errs, errors.New("datapath: nat_closing_timeout must be positive"))
	}
	if d.Monitor.Sample < 1 || d.Monitor.Sample > 1000000 {
		errs = append(errs, fmt.Errorf("datapath.monitor.sample: %d must be from 1 to 1000000", d.Monitor.Sample))
	}
	if d.Monitor.Rate < 1 || d.Monitor.Rate > 1000000 {
		errs = append(errs, fmt.Errorf("datapath.monitor.rate: %d must be from 1 to 1000000 packets a second", d.Monitor.Rate))
	}
	if s := d.SocketLB; s.Enabled {
		if s.Cgroup != "" && !filepath.IsAbs(s.Cgroup) {
			errs = append(errs, fmt.Errorf("datapath.socket_lb.cgroup: %q must be an absolute path", s.Cgroup))
		}
		if s.Translations < 1024 {
			errs = append(errs, fmt.Errorf("datapath.socket_lb.translations: %d must be at least 1024", s.Translations))
		}
	}
	return errs
}
