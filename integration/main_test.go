//go:build linux

// Package integration runs lbd end to end in network namespaces: a client, a BIRD
// router spreading the VIPs over the LB nodes with ECMP, LB nodes running
// `lbd --role lb` (XDP) that announce the VIPs to the router over BGP, backend nodes
// running `lbd --role backend` (TC) with real TCP and UDP servers, all joined by a
// fabric bridge (docs/testing.md).
//
// The tests need root and the tools listed in requireEnv; without them they skip with
// the reason. They build bin/lbd and bin/lbctl themselves unless LBD_BIN_DIR names a
// directory that already holds both (`make integration` builds them first).
package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/lbd-dev/lbd/internal/testnet"
)

// serverEnv, when set in the environment, turns the test binary into the backend
// servers of one node (see servers_test.go) instead of running tests: the testbed
// starts it inside each backend namespace.
const serverEnv = "LBD_IT_SERVER"

func TestMain(m *testing.M) {
	if name := os.Getenv(serverEnv); name != "" {
		os.Exit(serve(name))
	}
	code := m.Run()
	if builtDir != "" {
		os.RemoveAll(builtDir)
	}
	os.Exit(code)
}

// requireEnv skips the test unless it runs as root with every tool the testbed drives,
// and the extra ones.
func requireEnv(t *testing.T, extra ...string) {
	t.Helper()
	testnet.Require(t, append([]string{"ip", "nsenter", "ethtool", "bird", "birdc"}, extra...)...)
}

var (
	buildOnce sync.Once
	builtDir  string // temporary directory of binaries built by this run
	binDir    string
	buildErr  error
)

// binaries returns the paths of lbd and lbctl, building them once per run unless
// LBD_BIN_DIR points at binaries built already.
func binaries(t testing.TB) (lbd, lbctl string) {
	t.Helper()
	buildOnce.Do(func() {
		if dir := os.Getenv("LBD_BIN_DIR"); dir != "" {
			binDir = dir
			for _, b := range []string{"lbd", "lbctl"} {
				if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
					buildErr = fmt.Errorf("LBD_BIN_DIR: %w", err)
				}
			}
			return
		}
		dir, err := os.MkdirTemp("", "lbd-it-bin-")
		if err != nil {
			buildErr = fmt.Errorf("create build directory: %w", err)
			return
		}
		builtDir, binDir = dir, dir
		// go test puts its own go command first in PATH.
		gobin, err := exec.LookPath("go")
		if err != nil {
			buildErr = fmt.Errorf("build lbd: %w (or set LBD_BIN_DIR)", err)
			return
		}
		for _, b := range []string{"lbd", "lbctl"} {
			cmd := exec.Command(gobin, "build", "-buildvcs=false", "-o", filepath.Join(dir, b), "./cmd/"+b)
			cmd.Dir = ".."
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("build %s: %w: %s", b, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, "lbd"), filepath.Join(binDir, "lbctl")
}
