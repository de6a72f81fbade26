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
//   - LB role: accept_local on the uplinks. A packet handed to the kernel to resolve a
//     next hop is already encapsulated, with the node's own address as outer source;
//     without accept_local the kernel drops it as a martian, and the first packets
//     toward a backend node whose neighbour entry is not resolved yet are lost. (IPv6
//     has no such check.) Strict reverse-path filtering would drop them too, so an
//     uplink with rp_filter 1 gets 2 (loose), as on backend nodes.
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
	// all, if set, is the "all" counterpart of path, whose value the kernel applies when
	// it is the larger (rp_filter): unless is then compared with the value in effect.
	all string
}

// neededSysctls lists the settings of the roles on their interfaces, in the order to
// apply them.
func (c Config) neededSysctls() []sysctl {
	var out []sysctl
	for _, ifc := range c.Interfaces {
		if c.LB {
			out = append(out,
				sysctl{path: "net/ipv4/conf/" + ifc + "/forwarding", want: "1"},
				sysctl{path: "net/ipv4/conf/" + ifc + "/accept_local", want: "1"},
				sysctl{path: "net/ipv6/conf/" + ifc + "/accept_ra", want: "2", unless: []string{"0", "2"}},
				sysctl{path: "net/ipv6/conf/" + ifc + "/forwarding", want: "1"})
		}
		if c.LB || c.Backend {
			out = append(out, sysctl{path: "net/ipv4/conf/" + ifc + "/rp_filter", want: "2", unless: []string{"0", "2"},
				all: "net/ipv4/conf/all/rp_filter"})
		}
	}
	return out
}

// effective is the value in effect when the setting's own is cur: the larger of cur
// and its "all" counterpart, if it has one (values are single digits).
func (s sysctl) effective(cur string) string {
	if s.all == "" {
		return cur
	}
	b, err := os.ReadFile(filepath.Join(sysctlRoot, s.all))
	if err != nil {
		return cur
	}
	return max(cur, strings.TrimSpace(string(b)))
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
		if cur == s.want || slices.Contains(s.unless, s.effective(cur)) {
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
