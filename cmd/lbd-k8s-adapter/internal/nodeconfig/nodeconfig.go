// Package nodeconfig renders a per-node configuration file from a template shared by
// every node (a ConfigMap) and what the downward API tells a pod about its node, so a
// DaemonSet needs no ConfigMap per node for settings such as lbd's BGP router ID.
package nodeconfig

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
)

// Node is what a template may refer to.
type Node struct {
	// Name is the node's name (downward API spec.nodeName).
	Name string
	// IPs are the node's addresses (downward API status.hostIPs).
	IPs []netip.Addr
}

// FromEnv reads a Node from NODE_NAME and NODE_IPS (a comma-separated list, as the
// downward API writes status.hostIPs into an environment variable).
func FromEnv(getenv func(string) string) (Node, error) {
	n := Node{Name: getenv("NODE_NAME")}
	for part := range strings.SplitSeq(getenv("NODE_IPS"), ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		a, err := netip.ParseAddr(part)
		if err != nil {
			return Node{}, fmt.Errorf("NODE_IPS: %q is not an IP address", part)
		}
		n.IPs = append(n.IPs, a.Unmap())
	}
	return n, nil
}

// Variables are the names a template may use, as ${NAME}.
var Variables = []string{"NODE_NAME", "NODE_IPV4", "NODE_IPV6"}

// Render replaces ${NODE_NAME}, ${NODE_IPV4} and ${NODE_IPV6} (the node's first address
// of each family) in tmpl; "$$" is a "$". Any other variable, or one the node has no value
// for, is an error naming it: a half-rendered file must not reach lbd.
func Render(tmpl string, n Node) (string, error) {
	var errs []error
	out := os.Expand(tmpl, func(name string) string {
		var v string
		switch name {
		case "$":
			return "$"
		case "NODE_NAME":
			v = n.Name
		case "NODE_IPV4", "NODE_IPV6":
			for _, a := range n.IPs {
				if a.Is4() == (name == "NODE_IPV4") {
					v = a.String()
					break
				}
			}
		default:
			errs = append(errs, fmt.Errorf("${%s} is not a variable (known: %s; write $$ for a $)", name, strings.Join(Variables, ", ")))
			return ""
		}
		if v == "" {
			errs = append(errs, fmt.Errorf("${%s} has no value for this node (NODE_NAME=%q, NODE_IPS=%v)", name, n.Name, n.IPs))
		}
		return v
	})
	if err := errors.Join(errs...); err != nil {
		return "", err
	}
	return out, nil
}

// RenderFile renders the template file in into out (written whole, then renamed, so lbd
// never reads half a file).
func RenderFile(in, out string, n Node) error {
	tmpl, err := os.ReadFile(in)
	if err != nil {
		return fmt.Errorf("read template: %w", err)
	}
	s, err := Render(string(tmpl), n)
	if err != nil {
		return fmt.Errorf("render %s: %w", in, err)
	}
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	return nil
}
