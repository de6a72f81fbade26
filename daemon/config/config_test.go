package config_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/daemon/config"
	"sigs.k8s.io/yaml"
)

const example = "../../examples/lbd.yaml"

// TestExampleIsDefault checks that the sample configuration, which documents the
// defaults, says what Default actually is.
func TestExampleIsDefault(t *testing.T) {
	got, err := config.Load(example)
	if err != nil {
		t.Fatalf("load %s: %v", example, err)
	}
	want := config.Default()
	// The example spells out "roles: []"; an empty list and none mean the same.
	if len(got.Roles) == 0 && len(want.Roles) == 0 {
		got.Roles, want.Roles = nil, nil
	}
	if len(got.Datapath.Interfaces) == 0 && len(got.Datapath.LBSources) == 0 {
		got.Datapath.Interfaces, got.Datapath.LBSources = want.Datapath.Interfaces, want.Datapath.LBSources
	}
	if len(got.Metrics.BackendSeriesServices) == 0 {
		got.Metrics.BackendSeriesServices = want.Metrics.BackendSeriesServices
	}
	if len(got.Metrics.ServiceSeriesServices) == 0 {
		got.Metrics.ServiceSeriesServices = want.Metrics.ServiceSeriesServices
	}
	if len(got.Store.Endpoints) == 0 {
		got.Store.Endpoints = want.Store.Endpoints
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s loads as\n%+v\nbut Default() is\n%+v", example, got, want)
	}
	if err := want.Validate(); err != nil {
		t.Errorf("Default() is invalid: %v", err)
	}
}

// keys returns the dotted paths of every leaf key of a decoded JSON/YAML object.
func keys(prefix string, v any) []string {
	m, ok := v.(map[string]any)
	if !ok {
		return []string{prefix}
	}
	var out []string
	for k, sub := range m {
		if prefix != "" {
			k = prefix + "." + k
		}
		out = append(out, keys(k, sub)...)
	}
	slices.Sort(out)
	return out
}

// TestExampleDocumentsEveryField checks that every configuration field appears in the
// sample configuration, the file the package documentation points to.
func TestExampleDocumentsEveryField(t *testing.T) {
	data, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("parse %s: %v", example, err)
	}
	raw, err := json.Marshal(config.Default())
	if err != nil {
		t.Fatal(err)
	}
	var def any
	if err := json.Unmarshal(raw, &def); err != nil {
		t.Fatal(err)
	}
	documented := keys("", doc)
	for _, k := range keys("", def) {
		if !slices.Contains(documented, k) {
			t.Errorf("field %s is not in %s", k, example)
		}
	}
}

func writeConfig(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "lbd.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestLoadKeepsDefaults checks that a file setting a few fields keeps the defaults of the
// others, including sibling fields in the same section.
func TestLoadKeepsDefaults(t *testing.T) {
	path := writeConfig(t, "log:\n  json: true\nlimits:\n  max_services: 10\nroles: [lb, backend]\n"+
		"datapath:\n  interfaces: [eth0]\n  lb_sources: [198.18.0.0/24]\n  gc_max_interval: 2m\n")
	got, err := config.Load(path)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	want := config.Default()
	want.Log.JSON = true
	want.Limits.MaxServices = 10
	want.Roles = []string{config.RoleLB, config.RoleBackend}
	want.Datapath.Interfaces = []string{"eth0"}
	want.Datapath.LBSources = []string{"198.18.0.0/24"}
	want.Datapath.GCMaxInterval = config.Duration(2 * time.Minute)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("loaded\n%+v\nwant\n%+v", got, want)
	}
}

// TestLoadErrors checks that a file that cannot be used is an error naming the file and
// the offending field.
func TestLoadErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		content string
		want    []string
	}{
		{"unknown top-level field", "stat_dir: /var/lib/lbd\n", []string{"unknown field", "stat_dir"}},
		{"unknown nested field", "api:\n  tcp:\n    listen_addr: 127.0.0.1:1\n", []string{"unknown field", "listen_addr"}},
		{"unknown limit", "limits:\n  max_vips: 3\n", []string{"unknown field", "max_vips"}},
		{"wrong type", "log:\n  json: sometimes\n", []string{"json"}},
		{"wrong type of number", "limits:\n  max_services: many\n", []string{"max_services"}},
		{"not YAML", "log: [unclosed\n", []string{"parse config"}},
		{"field twice", "state_dir: /a\nstate_dir: /b\n", []string{"state_dir"}},
		{"invalid value", "log:\n  level: chatty\n", []string{"log.level", "chatty"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tc.content)
			_, err := config.Load(path)
			if err == nil {
				t.Fatalf("Load accepted %q", tc.content)
			}
			for _, w := range append(tc.want, path) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}

	missing := filepath.Join(t.TempDir(), "absent.yaml")
	if _, err := config.Load(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("Load of a missing file: %v, want an error naming it", err)
	}
}

// TestValidate sends each rule a configuration that breaks it and expects an error naming
// the field; the valid variants next to them must pass.
func withDatapath(c *config.Config) {
	c.Datapath.Interfaces = []string{"eth0"}
	c.Datapath.LBSources = []string{"198.18.0.0/24"}
}

func TestValidate(t *testing.T) {
	withTCP := func(c *config.Config) {
		c.API.TCP = config.TCP{Listen: "127.0.0.1:7443", CertFile: "/etc/lbd/cert.pem", KeyFile: "/etc/lbd/key.pem", ClientCAFile: "/etc/lbd/ca.pem"}
	}
	for _, tc := range []struct {
		name string
		edit func(*config.Config)
		// want are the strings the error must contain; none means the config is valid.
		want []string
	}{
		{"default", func(*config.Config) {}, nil},
		{"every level", func(c *config.Config) { c.Log.Level = "trace" }, nil},
		{"empty log level", func(c *config.Config) { c.Log.Level = "" }, []string{"log.level"}},
		{"unknown log level", func(c *config.Config) { c.Log.Level = "verbose" }, []string{"log.level", "verbose"}},
		{"upper-case log level", func(c *config.Config) { c.Log.Level = "INFO" }, []string{"log.level", "INFO"}},
		{"empty state dir", func(c *config.Config) { c.StateDir = "" }, []string{"state_dir", "absolute"}},
		{"relative state dir", func(c *config.Config) { c.StateDir = "var/lib/lbd" }, []string{"state_dir", "var/lib/lbd"}},
		{"no listener", func(c *config.Config) { c.API.Socket = "" }, []string{"api", "unreachable"}},
		{"TCP only", func(c *config.Config) { c.API.Socket = ""; withTCP(c) }, nil},
		{"socket and TCP", withTCP, nil},
		{"relative socket", func(c *config.Config) { c.API.Socket = "lbd.sock" }, []string{"api.socket", "lbd.sock"}},
		{"listen without port", func(c *config.Config) { withTCP(c); c.API.TCP.Listen = "127.0.0.1" }, []string{"api.tcp.listen", "host:port"}},
		{"listen without certificate", func(c *config.Config) { withTCP(c); c.API.TCP.CertFile = "" }, []string{"api.tcp", "cert_file"}},
		{"listen without key", func(c *config.Config) { withTCP(c); c.API.TCP.KeyFile = "" }, []string{"api.tcp", "key_file"}},
		{"listen without client CA", func(c *config.Config) { withTCP(c); c.API.TCP.ClientCAFile = "" }, []string{"api.tcp", "client_ca_file"}},
		{"certificates without listen", func(c *config.Config) { withTCP(c); c.API.TCP.Listen = "" }, nil},
		{"both roles", func(c *config.Config) { c.Roles = []string{"lb", "backend"}; withDatapath(c) }, nil},
		{"role without interface", func(c *config.Config) { c.Roles = []string{"lb"} }, []string{"datapath.interfaces"}},
		{"backend without LB sources", func(c *config.Config) { withDatapath(c); c.Roles = []string{"backend"}; c.Datapath.LBSources = nil }, []string{"datapath.lb_sources"}},
		{"bad LB source", func(c *config.Config) { withDatapath(c); c.Datapath.LBSources = []string{"198.18.0.0/33"} }, []string{"datapath.lb_sources[0]"}},
		{"underlay family", func(c *config.Config) { c.Datapath.UnderlayV4 = "2001:db8::1" }, []string{"datapath.underlay_v4"}},
		{"underlay v6 family", func(c *config.Config) { c.Datapath.UnderlayV6 = "198.18.0.1" }, []string{"datapath.underlay_v6"}},
		{"relative bpffs dir", func(c *config.Config) { c.Datapath.BPFFSDir = "bpf" }, []string{"datapath.bpffs_dir"}},
		{"vni too big", func(c *config.Config) { c.Datapath.VNI = 1 << 24 }, []string{"datapath.vni"}},
		{"tiny conntrack", func(c *config.Config) { c.Datapath.ConntrackSize = 10 }, []string{"conntrack_size"}},
		{"gc bounds", func(c *config.Config) { c.Datapath.GCMaxInterval = config.Duration(time.Millisecond) }, []string{"gc_min_interval"}},
		{"nat idle timeout set", func(c *config.Config) { c.Datapath.NATIdleTimeout = config.Duration(time.Hour) }, []string{"nat_idle_timeout", "tcp_idle_timeout"}},
		{"tcp idle timeout", func(c *config.Config) { c.Datapath.TCPIdleTimeout = config.Duration(time.Millisecond) }, []string{"tcp_idle_timeout"}},
		{"socket lb without role", func(c *config.Config) { c.Datapath.SocketLB.Enabled = true }, nil},
		{"socket lb relative cgroup", func(c *config.Config) {
			c.Datapath.SocketLB = config.SocketLB{Enabled: true, Cgroup: "lbd", Translations: 4096}
		}, []string{"datapath.socket_lb.cgroup", `"lbd"`}},
		{"socket lb tiny table", func(c *config.Config) {
			c.Datapath.SocketLB = config.SocketLB{Enabled: true, Translations: 10}
		}, []string{"datapath.socket_lb.translations"}},
		{"socket lb off ignores its fields", func(c *config.Config) { c.Datapath.SocketLB = config.SocketLB{Cgroup: "lbd"} }, nil},
		{"metrics listen", func(c *config.Config) { c.MetricsListen = "9310" }, []string{"metrics_listen"}},
		{"backend series for listed services", func(c *config.Config) { c.Metrics.BackendSeriesServices = []string{"web", "payments/*"} }, nil},
		{"backend series for every service", func(c *config.Config) { c.Metrics.BackendSeries = true }, nil},
		{"backend series both ways", func(c *config.Config) {
			c.Metrics = config.Metrics{BackendSeries: true, BackendSeriesServices: []string{"web"}}
		}, []string{"metrics.backend_series_services", "metrics.backend_series is true"}},
		{"backend series blank service", func(c *config.Config) { c.Metrics.BackendSeriesServices = []string{"web", ""} }, []string{"metrics.backend_series_services[1]", "empty"}},
		{"service series for listed services", func(c *config.Config) { c.Metrics.ServiceSeriesServices = []string{"web", "payments/*"} }, nil},
		{"service series without limit", func(c *config.Config) { c.Metrics.ServiceSeriesLimit = 0 }, nil},
		{"service series negative limit", func(c *config.Config) { c.Metrics.ServiceSeriesLimit = -1 }, []string{"metrics.service_series_limit", "-1", "negative"}},
		{"service series blank service", func(c *config.Config) { c.Metrics.ServiceSeriesServices = []string{"*", ""} }, []string{"metrics.service_series_services[1]", "empty"}},
		{"service series listed without limit", func(c *config.Config) {
			c.Metrics.ServiceSeriesLimit, c.Metrics.ServiceSeriesServices = 0, []string{"web"}
		}, []string{"metrics.service_series_services", "metrics.service_series_limit is 0"}},
		{"total backends below per-service", func(c *config.Config) { c.Limits.MaxBackends = 10 }, []string{"max_backends"}},
		{"unknown role", func(c *config.Config) { c.Roles = []string{"router"} }, []string{"roles", "router"}},
		{"role twice", func(c *config.Config) { c.Roles = []string{"lb", "lb"} }, []string{"roles", "twice"}},
		{"no services allowed", func(c *config.Config) { c.Limits.MaxServices = 0 }, []string{"limits", "max_services"}},
		{"no backends allowed", func(c *config.Config) { c.Limits.MaxBackendsPerService = 0 }, []string{"limits", "max_backends_per_service"}},
		{"negative source ranges", func(c *config.Config) { c.Limits.MaxSourceRanges = -1 }, []string{"limits", "max_source_ranges"}},
		{"negative BGP peers", func(c *config.Config) { c.Limits.MaxBgpPeers = -1 }, []string{"limits", "max_bgp_peers"}},
		{"zero BGP peers", func(c *config.Config) { c.Limits.MaxBgpPeers = 0 }, nil},
		{"smallest table", func(c *config.Config) { c.Limits.DefaultTableSize = 251 }, nil},
		{"largest table", func(c *config.Config) { c.Limits.DefaultTableSize = 131071 }, nil},
		{"table not prime", func(c *config.Config) { c.Limits.DefaultTableSize = 1000 }, []string{"limits", "default_maglev_table_size", "1000"}},
		{"table too small", func(c *config.Config) { c.Limits.DefaultTableSize = 241 }, []string{"limits", "default_maglev_table_size", "241"}},
		{"table too large", func(c *config.Config) { c.Limits.DefaultTableSize = 131101 }, []string{"limits", "default_maglev_table_size", "131101"}},
		{"several errors", func(c *config.Config) { c.Log.Level = "loud"; c.StateDir = "rel"; c.Roles = []string{"x"} }, []string{"log.level", "state_dir", "roles"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := config.Default()
			tc.edit(&c)
			err := c.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("valid configuration refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("invalid configuration accepted: %+v", c)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestLBNodeExampleLoads checks the bare-metal LB node example, BGP section included.
func TestLBNodeExampleLoads(t *testing.T) {
	c, err := config.Load("../../examples/lbd-lb-node.yaml")
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if c.BGP == nil || len(c.BGP.Peers) != 2 || len(c.Datapath.Interfaces) != 1 {
		t.Errorf("example not read as written: %+v", c)
	}
}

func TestBGPNeedsLBRole(t *testing.T) {
	path := writeConfig(t, "bgp:\n  router_id: 198.18.0.11\n  local_as: 65010\n")
	if _, err := config.Load(path); err == nil || !strings.Contains(err.Error(), "bgp") {
		t.Errorf("BGP on a node without the LB role: %v", err)
	}
}

func TestByteSize(t *testing.T) {
	for in, want := range map[string]uint64{`"auto"`: 0, `""`: 0, `"512MiB"`: 512 << 20, `"8GiB"`: 8 << 30, `"3B"`: 3, `4096`: 4096} {
		var b config.ByteSize
		if err := b.UnmarshalJSON([]byte(in)); err != nil || uint64(b) != want {
			t.Errorf("%s: %d %v, want %d", in, b, err, want)
		}
	}
	for _, in := range []string{`"1.5GiB"`, `"12XB"`, `"GiB"`, `"-1MiB"`, `"99999999999TiB"`} {
		var b config.ByteSize
		if err := b.UnmarshalJSON([]byte(in)); err == nil {
			t.Errorf("%s: accepted as %d", in, b)
		}
	}
	if out, _ := config.ByteSize(8 << 30).MarshalJSON(); string(out) != `"8GiB"` {
		t.Errorf("8 GiB written as %s", out)
	}
}

// TestStoreValidation: a bad store section is refused with an error naming the field.
func TestStoreValidation(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"store: {type: zookeeper}", "store.type"},
		{"store: {type: etcd}", "store.endpoints"},
		{"store: {type: etcd, endpoints: [198.18.10.1:2379]}", "store.endpoints[0]"},
		{"store: {type: etcd, endpoints: [\"https://198.18.10.1:2379\"]}", "store.endpoints[0]"},
		{"store: {type: etcd, endpoints: [\"http://198.18.10.1:2379\"], prefix: lbd}", "store.prefix"},
		{"store: {type: etcd, endpoints: [\"https://198.18.10.1:2379\"], tls: {ca_file: /ca.pem}}", "store.tls"},
		{"store: {type: etcd, endpoints: [\"http://198.18.10.1:2379\"], node_name: a/b}", "store.node_name"},
		{"store: {type: file, endpoints: [\"http://198.18.10.1:2379\"]}", "store.endpoints"},
	} {
		_, err := config.Load(writeConfig(t, tc.yaml+"\n"))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %s", tc.yaml, err, tc.want)
		}
	}
	c, err := config.Load(writeConfig(t, "store: {type: etcd, endpoints: [\"https://198.18.10.1:2379\"], prefix: /lbd/edge-1/,"+
		" tls: {ca_file: /etc/lbd/pki/ca.pem, cert_file: /etc/lbd/pki/lb1.pem, key_file: /etc/lbd/pki/lb1.key}}\n"))
	if err != nil || c.Store.Type != config.StoreEtcd || c.Store.Prefix != "/lbd/edge-1/" {
		t.Fatalf("a valid etcd store: %+v, %v", c.Store, err)
	}
}

// TestLoadErrorPositions: every kind of mistake in the file is reported with its line
// and column, and all unknown fields at once.
func TestLoadErrorPositions(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"datapath:\n  interfaces: [eth0]\n  conntrack_sise: 5\nbogus: 1\n",
			`line 3, column 3: unknown field "conntrack_sise" in datapath (known: bpffs_dir, conntrack_guard_rate, conntrack_size,`},
		{"datapath:\n  interfaces: [eth0]\n  conntrack_sise: 5\nbogus: 1\n",
			"\n" + `line 4, column 1: unknown field "bogus" at the top level (known: api, bgp, datapath,`},
		{"bgp:\n  router_id: 198.18.0.11\n  peers:\n    - address: 198.18.0.1\n      peer_asn: 65000\n", `line 5, column 7: unknown field "peer_asn" in bgp.peers[0]`},
		{"datapath:\n  gc_min_interval: 5x\n", `line 2, column 20: datapath.gc_min_interval: time: unknown unit "x"`},
		{"datapath:\n  vni: \"two\"\n", "line 2, column 8: datapath.vni: a string value where a uint32 is expected"},
		{"datapath:\n  vni: [\n", "yaml: line 2:"},
	} {
		_, err := config.Load(writeConfig(t, tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v\nwant an error containing %q", tc.yaml, err, tc.want)
		}
	}
}
