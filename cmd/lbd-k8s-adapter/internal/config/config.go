// Package config is the adapter's configuration file (YAML): which lbd to program under
// which owner name, which Services are ours, the address pools to allocate VIPs from, and
// the timings of syncing and leader election.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/ipam"
	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/translate"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// DefaultLoadBalancerClass is the spec.loadBalancerClass the adapter answers to by default.
const DefaultLoadBalancerClass = "lbd-dev.github.io/lbd"

// Default client-side rate limits (see KubeClient).
const (
	DefaultQPS        = 200
	DefaultBurst      = 400
	DefaultEventQPS   = 50
	DefaultEventBurst = 200
)

// Config is the adapter's configuration file.
type Config struct {
	// Owner is the lbd owner name under which the adapter applies its services: one per
	// cluster, so two clusters can share an lbd.
	Owner string `json:"owner"`
	// LbdAddress is the gRPC target of lbd, e.g. "unix:///run/lbd/lbd.sock".
	LbdAddress string `json:"lbdAddress"`
	// Kubeconfig is a kubeconfig file; empty uses the in-cluster service account.
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// LoadBalancerClass selects the LoadBalancer Services that are ours.
	LoadBalancerClass string `json:"loadBalancerClass,omitempty"`
	// ClaimClassless makes LoadBalancer Services without spec.loadBalancerClass ours too
	// (default true: lbd is then the cluster's default load balancer; set false when another
	// implementation handles class-less Services).
	ClaimClassless *bool `json:"claimClassless,omitempty"`
	// ServiceProxyName is the value of service.kubernetes.io/service-proxy-name that marks
	// a Service as ours; Services labelled with another value are ignored.
	ServiceProxyName string `json:"serviceProxyName,omitempty"`
	// ExternalIPs serves spec.externalIPs (default false). Only addresses inside one of
	// the pools are served: anyone who may create a Service could otherwise capture the
	// traffic of any address (CVE-2020-8554).
	ExternalIPs *bool `json:"externalIPs,omitempty"`
	// MaxBackendsPerService must not exceed lbd's limit of the same name (default 1024).
	MaxBackendsPerService int `json:"maxBackendsPerService,omitempty"`
	// Sync bounds how often lbd is programmed.
	Sync Sync `json:"sync,omitempty"`
	// Pools are the addresses allocated to LoadBalancer Services that have no ingress IP.
	Pools []Pool `json:"pools,omitempty"`
	// LeaderElection elects the one replica that writes Service status.
	LeaderElection LeaderElection `json:"leaderElection,omitempty"`
	// KubeClient bounds the adapter's requests to the Kubernetes API server.
	KubeClient KubeClient `json:"kubeClient,omitempty"`
	// HealthListen is the address of /healthz (liveness) and /readyz (readiness), e.g.
	// "127.0.0.1:9311"; empty serves neither.
	HealthListen string `json:"healthListen,omitempty"`
}

// KubeClient is the client-side rate limit of the adapter's API requests (client-go's
// QPS and burst). Status writes (one per Service whose VIPs or conditions change) and the
// Lease share one budget; Events have their own, so a burst of Events never delays a VIP.
type KubeClient struct {
	// QPS and Burst of status writes and the Lease (defaults 200 and 400: 1,000 new
	// Services get their VIPs within seconds).
	QPS   float32 `json:"qps,omitempty"`
	Burst int     `json:"burst,omitempty"`
	// EventQPS and EventBurst of Events (defaults 50 and 200).
	EventQPS   float32 `json:"eventQPS,omitempty"`
	EventBurst int     `json:"eventBurst,omitempty"`
}

// Sync bounds the frequency of ApplyServices calls, as kube-proxy bounds its syncs.
type Sync struct {
	// MinInterval is the least time between two applies: changes arriving faster are
	// batched (default 1s).
	MinInterval metav1.Duration `json:"minInterval,omitempty"`
	// MaxInterval is the most time between two applies: lbd is re-programmed at least this
	// often even without change, which repairs any drift (default 5m).
	MaxInterval metav1.Duration `json:"maxInterval,omitempty"`
}

// Pool is a named set of addresses.
type Pool struct {
	Name string `json:"name"`
	// Addresses are CIDR prefixes ("203.0.113.0/28") or inclusive ranges
	// ("203.0.113.10-203.0.113.20"); every address in them may be allocated.
	Addresses []string `json:"addresses"`
	// AutoAssign lets the pool serve Services that do not name a pool (default true).
	AutoAssign *bool `json:"autoAssign,omitempty"`
}

// LeaderElection configures the Lease that elects the status writer.
type LeaderElection struct {
	// Namespace and Name of the Lease (defaults: "lbd-system", "lbd-k8s-adapter").
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	// Defaults 15s, 10s, 2s, as client-go recommends.
	LeaseDuration metav1.Duration `json:"leaseDuration,omitempty"`
	RenewDeadline metav1.Duration `json:"renewDeadline,omitempty"`
	RetryPeriod   metav1.Duration `json:"retryPeriod,omitempty"`
}

// lbdNameRE is lbd's owner-name shape (see proto/lbd/v1).
var lbdNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,252}$`)

// Load reads, defaults and validates a configuration file.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Parse decodes YAML strictly (an unknown or misspelt key is an error, not a silent
// default), fills in defaults and validates.
func Parse(data []byte) (*Config, error) {
	var c Config
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return nil, fmt.Errorf("parse config: %w", err)
	}
	c.setDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

func (c *Config) setDefaults() {
	yes := true
	if c.LoadBalancerClass == "" {
		c.LoadBalancerClass = DefaultLoadBalancerClass
	}
	if c.ClaimClassless == nil {
		c.ClaimClassless = &yes
	}
	if c.ExternalIPs == nil {
		no := false
		c.ExternalIPs = &no
	}
	kc := &c.KubeClient
	if kc.QPS == 0 {
		kc.QPS = DefaultQPS
	}
	if kc.Burst == 0 {
		kc.Burst = DefaultBurst
	}
	if kc.EventQPS == 0 {
		kc.EventQPS = DefaultEventQPS
	}
	if kc.EventBurst == 0 {
		kc.EventBurst = DefaultEventBurst
	}
	if c.MaxBackendsPerService == 0 {
		c.MaxBackendsPerService = 1024
	}
	def := func(d *metav1.Duration, v time.Duration) {
		if d.Duration == 0 {
			d.Duration = v
		}
	}
	def(&c.Sync.MinInterval, time.Second)
	def(&c.Sync.MaxInterval, 5*time.Minute)
	le := &c.LeaderElection
	if le.Namespace == "" {
		le.Namespace = "lbd-system"
	}
	if le.Name == "" {
		le.Name = "lbd-k8s-adapter"
	}
	def(&le.LeaseDuration, 15*time.Second)
	def(&le.RenewDeadline, 10*time.Second)
	def(&le.RetryPeriod, 2*time.Second)
	for i := range c.Pools {
		if c.Pools[i].AutoAssign == nil {
			c.Pools[i].AutoAssign = &yes
		}
	}
}

// Validate checks a defaulted configuration and reports every problem at once.
func (c *Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if !lbdNameRE.MatchString(c.Owner) {
		bad("owner", "%q must be 1-253 characters of [A-Za-z0-9._:/-] starting with a letter or digit", c.Owner)
	}
	if c.LbdAddress == "" {
		bad("lbdAddress", "is required (e.g. unix:///run/lbd/lbd.sock)")
	}
	for _, msg := range validation.IsQualifiedName(c.LoadBalancerClass) {
		bad("loadBalancerClass", "%q: %s", c.LoadBalancerClass, msg)
	}
	if !strings.Contains(c.LoadBalancerClass, "/") {
		bad("loadBalancerClass", "%q must be prefixed with a domain, like %q", c.LoadBalancerClass, DefaultLoadBalancerClass)
	}
	if c.ServiceProxyName != "" {
		for _, msg := range validation.IsValidLabelValue(c.ServiceProxyName) {
			bad("serviceProxyName", "%q: %s", c.ServiceProxyName, msg)
		}
	}
	if c.MaxBackendsPerService < 1 {
		bad("maxBackendsPerService", "must be at least 1, got %d", c.MaxBackendsPerService)
	}
	if c.Sync.MinInterval.Duration < 0 || c.Sync.MaxInterval.Duration < c.Sync.MinInterval.Duration {
		bad("sync", "need 0 <= minInterval (%v) <= maxInterval (%v)", c.Sync.MinInterval.Duration, c.Sync.MaxInterval.Duration)
	}
	le := c.LeaderElection
	if le.LeaseDuration.Duration <= le.RenewDeadline.Duration || le.RenewDeadline.Duration <= le.RetryPeriod.Duration || le.RetryPeriod.Duration <= 0 {
		bad("leaderElection", "need leaseDuration (%v) > renewDeadline (%v) > retryPeriod (%v) > 0",
			le.LeaseDuration.Duration, le.RenewDeadline.Duration, le.RetryPeriod.Duration)
	}
	kc := c.KubeClient
	if kc.QPS < 0 || kc.Burst < 1 || float32(kc.Burst) < kc.QPS {
		bad("kubeClient", "need 0 < qps (%v) <= burst (%d)", kc.QPS, kc.Burst)
	}
	if kc.EventQPS < 0 || kc.EventBurst < 1 || float32(kc.EventBurst) < kc.EventQPS {
		bad("kubeClient", "need 0 < eventQPS (%v) <= eventBurst (%d)", kc.EventQPS, kc.EventBurst)
	}
	if c.HealthListen != "" {
		if _, _, err := net.SplitHostPort(c.HealthListen); err != nil {
			bad("healthListen", "%q is not host:port: %v", c.HealthListen, err)
		}
	}
	for _, msg := range validation.IsDNS1123Subdomain(le.Name) {
		bad("leaderElection.name", "%q: %s", le.Name, msg)
	}
	for _, msg := range validation.IsDNS1123Label(le.Namespace) {
		bad("leaderElection.namespace", "%q: %s", le.Namespace, msg)
	}
	if _, err := c.IPPools(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// IPPools parses the pools. Two pools may not overlap: an address would then have two
// owners and its release could not be attributed.
func (c *Config) IPPools() ([]*ipam.Pool, error) {
	var out []*ipam.Pool
	names := map[string]bool{}
	for i, p := range c.Pools {
		field := fmt.Sprintf("pools[%d]", i)
		if len(validation.IsDNS1123Label(p.Name)) > 0 {
			return nil, fmt.Errorf("%s.name: %q must be a DNS label", field, p.Name)
		}
		if names[p.Name] {
			return nil, fmt.Errorf("%s.name: duplicate pool %q", field, p.Name)
		}
		names[p.Name] = true
		pool, err := ipam.NewPool(p.Name, p.Addresses, p.AutoAssign == nil || *p.AutoAssign)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		for _, other := range out {
			if a, ok := pool.Overlap(other); ok {
				return nil, fmt.Errorf("%s: pool %q overlaps pool %q at %s", field, p.Name, other.Name, a)
			}
		}
		out = append(out, pool)
	}
	return out, nil
}

// TranslateOptions are the translation settings of this configuration.
func (c *Config) TranslateOptions() translate.Options {
	pools, _ := c.IPPools() // valid: Validate checked them
	return translate.Options{
		LoadBalancerClass: c.LoadBalancerClass,
		ClaimClassless:    *c.ClaimClassless,
		ServiceProxyName:  c.ServiceProxyName,
		ExternalIPs:       *c.ExternalIPs,
		ExternalIPPool: func(a netip.Addr) string {
			for _, p := range pools {
				if p.Contains(a) {
					return p.Name
				}
			}
			return ""
		},
		MaxBackendsPerService: c.MaxBackendsPerService,
	}
}
