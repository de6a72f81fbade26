package config

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const full = `
owner: cluster-a
lbdAddress: unix:///run/lbd/lbd.sock
loadBalancerClass: example.com/lb
claimClassless: false
serviceProxyName: lbd
externalIPs: false
maxBackendsPerService: 512
sync:
  minInterval: 200ms
  maxInterval: 1m
pools:
  - name: public
    addresses: [203.0.113.0/28, "203.0.113.100-203.0.113.110", "2001:db8:ff::/120"]
  - name: reserved
    addresses: [203.0.113.200/29]
    autoAssign: false
leaderElection:
  namespace: kube-system
  name: lbd-status
  leaseDuration: 30s
  renewDeadline: 20s
  retryPeriod: 5s
kubeClient: {qps: 20, burst: 30, eventQPS: 5, eventBurst: 10}
healthListen: 127.0.0.1:9311
`

func TestParseFull(t *testing.T) {
	c, err := Parse([]byte(full))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	opt := c.TranslateOptions()
	if opt.LoadBalancerClass != "example.com/lb" || opt.ClaimClassless || opt.ServiceProxyName != "lbd" || opt.ExternalIPs || opt.MaxBackendsPerService != 512 {
		t.Errorf("translate options = %+v", opt)
	}
	if c.Sync.MinInterval.Duration != 200*time.Millisecond || c.Sync.MaxInterval.Duration != time.Minute {
		t.Errorf("sync = %+v", c.Sync)
	}
	if le := c.LeaderElection; le.Namespace != "kube-system" || le.Name != "lbd-status" || le.LeaseDuration.Duration != 30*time.Second {
		t.Errorf("leader election = %+v", le)
	}
	pools, err := c.IPPools()
	if err != nil || len(pools) != 2 || !pools[0].AutoAssign || pools[1].AutoAssign {
		t.Fatalf("pools = %v, %v", pools, err)
	}
	if kc := c.KubeClient; kc != (KubeClient{QPS: 20, Burst: 30, EventQPS: 5, EventBurst: 10}) || c.HealthListen != "127.0.0.1:9311" {
		t.Errorf("kubeClient = %+v, healthListen = %q", kc, c.HealthListen)
	}
	for addr, want := range map[string]string{"203.0.113.5": "public", "203.0.113.201": "reserved", "198.51.100.1": ""} {
		if got := opt.ExternalIPPool(netip.MustParseAddr(addr)); got != want {
			t.Errorf("ExternalIPPool(%s) = %q, want %q", addr, got, want)
		}
	}
}

func TestParseDefaults(t *testing.T) {
	c, err := Parse([]byte("owner: c\nlbdAddress: unix:///s\n"))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	opt := c.TranslateOptions()
	if opt.LoadBalancerClass != DefaultLoadBalancerClass || !opt.ClaimClassless || opt.ExternalIPs || opt.MaxBackendsPerService != 1024 {
		t.Errorf("defaults = %+v", opt)
	}
	if kc := c.KubeClient; kc != (KubeClient{QPS: DefaultQPS, Burst: DefaultBurst, EventQPS: DefaultEventQPS, EventBurst: DefaultEventBurst}) || c.HealthListen != "" {
		t.Errorf("kubeClient defaults = %+v, healthListen = %q", kc, c.HealthListen)
	}
	if c.Sync.MinInterval.Duration != time.Second || c.Sync.MaxInterval.Duration != 5*time.Minute {
		t.Errorf("sync defaults = %+v", c.Sync)
	}
	if le := c.LeaderElection; le.Namespace != "lbd-system" || le.Name != "lbd-k8s-adapter" ||
		le.LeaseDuration.Duration != 15*time.Second || le.RenewDeadline.Duration != 10*time.Second || le.RetryPeriod.Duration != 2*time.Second {
		t.Errorf("leader election defaults = %+v", le)
	}
}

func TestParseErrors(t *testing.T) {
	base := "owner: c\nlbdAddress: unix:///s\n"
	for _, tc := range []struct{ yaml, want string }{
		{"lbdAddress: unix:///s\n", "owner"},
		{"owner: c\n", "lbdAddress"},
		{"owner: 'has space'\nlbdAddress: x\n", "owner"},
		{base + "loadBalancerClass: nodomain\n", "prefixed with a domain"},
		{base + "loadBalancerClass: 'bad class/x'\n", "loadBalancerClass"},
		{base + "serviceProxyName: 'no spaces'\n", "serviceProxyName"},
		{base + "bogusKey: 1\n", "unknown field"},
		{base + "sync: {minInterval: 10s, maxInterval: 1s}\n", "sync"},
		{base + "leaderElection: {leaseDuration: 5s, renewDeadline: 10s}\n", "leaseDuration"},
		{base + "pools: [{name: a, addresses: [203.0.113.1/28]}]\n", "host bits"},
		{base + "pools: [{name: a, addresses: []}]\n", "no addresses"},
		{base + "pools: [{name: a, addresses: [203.0.113.0/28]}, {name: a, addresses: [203.0.113.16/28]}]\n", "duplicate pool"},
		{base + "pools: [{name: a, addresses: [203.0.113.0/28]}, {name: b, addresses: [203.0.113.8/29]}]\n", "overlaps"},
		{base + "pools: [{name: Bad_Name, addresses: [203.0.113.0/28]}]\n", "DNS label"},
		{base + "maxBackendsPerService: -1\n", "maxBackendsPerService"},
		{base + "kubeClient: {qps: 50, burst: 10}\n", "kubeClient: need 0 < qps (50) <= burst (10)"},
		{base + "kubeClient: {eventQPS: -1}\n", "eventQPS"},
		{base + "healthListen: nonsense\n", "healthListen"},
	} {
		_, err := Parse([]byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", tc.yaml, err, tc.want)
		}
	}
}

func TestLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "adapter.yaml")
	if err := os.WriteFile(path, []byte(full), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err != nil {
		t.Errorf("Load: %v", err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil || !strings.Contains(err.Error(), "read config") {
		t.Errorf("Load(missing) = %v, want a read error", err)
	}
}
