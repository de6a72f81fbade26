//go:build linux

// Package testnet is the one place where tests build networks: network namespaces,
// veth pairs, addresses, sysctls, commands and processes inside a namespace, packet
// captures, a private bpffs, and the cleanup of all of it (docs/testing.md lists the kernel
// traps it respects).
//
// Everything a helper creates is removed by t.Cleanup, whether the test passed or not.
// Cleanups run in reverse order of creation, so a test that creates its namespaces
// first, then mounts, then starts processes gets the teardown order docs/testing.md asks
// for: processes (by PID), then pins and mounts, then namespaces.
//
// Names must be unique per test, since `go test ./...` runs packages in parallel: build
// them from Suffix. Interface names are limited to 15 characters.
package testnet

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The address plan of every test network (docs/testing.md, "Address plan"). Nothing is sent to any other
// address: 192.0.2.0/24 in particular is the test machine's own subnet.
var (
	// Nodes holds the addresses of nodes, clients and routers.
	Nodes = netip.MustParsePrefix("198.18.0.0/15")
	// VIPs holds the IPv4 virtual IPs of services.
	VIPs = netip.MustParsePrefix("203.0.113.0/24")
	// IPv6 holds every IPv6 address, nodes and VIPs alike.
	IPv6 = netip.MustParsePrefix("2001:db8::/32")
)

// InPlan reports whether a is an address of the plan.
func InPlan(a netip.Addr) bool {
	a = a.Unmap()
	return Nodes.Contains(a) || VIPs.Contains(a) || IPv6.Contains(a)
}

// Require skips the test unless it runs as root and every tool is on PATH. Tests that
// need privileges or Debian tools skip with the reason instead of failing; CI installs
// everything and runs them all.
func Require(tb testing.TB, tools ...string) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: creates network namespaces and loads BPF programs")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			tb.Skipf("needs %s (Debian: make deps): %v", tool, err)
		}
	}
}

// Suffix returns 6 random hex digits that make a test's names unique.
func Suffix(tb testing.TB) string {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// Output runs cmd and returns its standard output; the error names the command and
// carries its standard error.
func Output(cmd *exec.Cmd) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Run runs a command on the host and returns its standard output, failing the test
// on error.
func Run(tb testing.TB, argv ...string) string {
	tb.Helper()
	out, err := Output(exec.Command(argv[0], argv[1:]...))
	if err != nil {
		tb.Fatal(err)
	}
	return out
}
