package lbd_test

import (
	"testing"
	"time"
)

// TestCheckConfigHost: --check-config refuses an interface this host does not have and
// an address none of its interfaces holds, naming each field, and accepts ones it has.
func TestCheckConfigHost(t *testing.T) {
	in := newInstance(t)
	dir := t.TempDir()
	bad := writeFile(t, dir, "bad.yaml", []byte("metrics_listen: 198.18.255.253:9310\n"+
		"datapath:\n  interfaces: [lo, nosuch0]\n  underlay_v4: 198.18.255.254\n  lb_sources: [198.18.0.0/24]\n"))
	code, out := runExit(t, 10*time.Second, in.args("--check-config", "--config", bad, "--role", "backend")...)
	if code != 2 {
		t.Errorf("--check-config with a missing interface: exit %d, want 2; output:\n%s", code, out)
	}
	assertContains(t, out, `datapath.interfaces[1]: interface "nosuch0" does not exist on this host`,
		"datapath.underlay_v4: 198.18.255.254 is not assigned to any interface of this host",
		"metrics_listen: 198.18.255.253 is not assigned to any interface of this host")

	good := writeFile(t, dir, "good.yaml", []byte("metrics_listen: 127.0.0.1:9310\n"+
		"datapath:\n  interfaces: [lo]\n  underlay_v4: 127.0.0.1\n  lb_sources: [198.18.0.0/24]\n"))
	code, out = runExit(t, 10*time.Second, in.args("--check-config", "--config", good, "--role", "backend")...)
	if code != 0 {
		t.Errorf("--check-config with lo and 127.0.0.1: exit %d, want 0; output:\n%s", code, out)
	}
	assertContains(t, out, "configuration is valid")
}
