//go:build linux

package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The kernel settings the datapath depends on, per interface, which lbd sets itself
// rather than leaving them to the operator (and checks again at every verification):
//   - LB role: forwarding on the uplinks. bpf_fib_lookup refuses to forward from an
//     interface without it, and packets handed to the kernel to resolve a next hop
//     are forwarded by it. Enabling IPv6 forwarding makes the kernel ignore router
//     advertisements on an interface whose accept_ra is 1, so such an interface gets
//     accept_ra 2 (accept them anyway) first.
//   - Backend role: loose reverse-path filtering on the uplinks. The stack sees the
//     client's address on the uplink once TC stripped the tunnel, and strict mode drops
//     it when the route back to the client leaves by another interface. The kernel
//     applies the larger of "all" and the interface's value, so 2 on the interface wins.

// sysctlRoot is /proc/sys; tests point it elsewhere.
var sysctlRoot = "/proc/sys"

// sysctl is one setting: a path below /proc/sys and the value lbd needs.
type sysctl struct {
	path, want string
	// unless skips the setting when the current value is one of these (a stricter or
	// equivalent choice of the operator's).
	unless []string
}

// neededSysctls lists the settings of the roles on their interfaces, in the order to
// apply them.
func (c Config) neededSysctls() []sysctl {
	var out []sysctl
	for _, ifc := range c.Interfaces {
		if c.LB {
			out = append(out,
				sysctl{path: "net/ipv4/conf/" + ifc + "/forwarding", want: "1"},
				sysctl{path: "net/ipv6/conf/" + ifc + "/accept_ra", want: "2", unless: []string{"0", "2"}},
				sysctl{path: "net/ipv6/conf/" + ifc + "/forwarding", want: "1"})
		}
		if c.Backend {
			out = append(out, sysctl{path: "net/ipv4/conf/" + ifc + "/rp_filter", want: "2", unless: []string{"0", "2"}})
		}
	}
	return out
}

// applySysctls sets what differs and returns what it changed ("path: old -> new").
// A setting the kernel lacks (IPv6 disabled) is skipped.
func (c Config) applySysctls() ([]string, error) {
	var changed, errs []string
	for _, s := range c.neededSysctls() {
		p := filepath.Join(sysctlRoot, s.path)
		b, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		cur := strings.TrimSpace(string(b))
		if cur == s.want || slices.Contains(s.unless, cur) {
			continue
		}
		if err := os.WriteFile(p, []byte(s.want), 0o644); err != nil {
			errs = append(errs, fmt.Sprintf("set %s: %v", s.path, err))
			continue
		}
		changed = append(changed, fmt.Sprintf("%s: %s -> %s", strings.ReplaceAll(s.path, "/", "."), cur, s.want))
	}
	if len(errs) > 0 {
		return changed, fmt.Errorf("kernel settings: %s", strings.Join(errs, "; "))
	}
	return changed, nil
}
