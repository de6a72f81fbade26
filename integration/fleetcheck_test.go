//go:build linux

package integration

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/bpf/lbxdp"
	"github.com/lbd-dev/lbd/internal/testnet"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/encoding/protojson"
)

// lbctlCode runs lbctl (its own -s flags given in args) and returns its exit code and
// output, for commands whose failure is the answer.
func (tb *testbed) lbctlCode(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(tb.lbctlBin, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), errOut.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String(), errOut.String()
	}
	t.Fatalf("run lbctl %s: %v", strings.Join(args, " "), err)
	return 0, "", ""
}

// fleetCheck runs lbctl fleet check over the LB nodes and returns its exit code and
// decoded answer.
func (tb *testbed) fleetCheck(t *testing.T) (int, *lbdv1.GetFleetResponse, string) {
	t.Helper()
	args := []string{"-o", "json", "fleet", "check"}
	for _, lb := range tb.lbs {
		args = append(args, "-s", "unix://"+lb.lbd.sock)
	}
	code, out, errOut := tb.lbctlCode(t, args...)
	resp := &lbdv1.GetFleetResponse{}
	if err := protojson.Unmarshal([]byte(out), resp); err != nil {
		t.Fatalf("lbctl fleet check: exit %d, %v: %s %s", code, err, out, errOut)
	}
	return code, resp, errOut
}

// divergedNames lists the diverged services of a fleet answer.
func divergedNames(r *lbdv1.GetFleetResponse) string {
	var names []string
	for _, d := range r.Diverged {
		names = append(names, d.Name)
	}
	return strings.Join(names, ",")
}

// plantBackendPort rewrites, behind lbd's back, the port of a service's first backend in
// the node's lb_backends map (struct lb_backend: address, node address, port, family,
// node family), as TestDriftRepair does.
func plantBackendPort(t *testing.T, d *daemon, svc string, port uint16) {
	t.Helper()
	be := d.service(t, svc).GetBackends()[0]
	key := binary.LittleEndian.AppendUint32(nil, be.GetId())
	val := make([]byte, 36)
	copy(val[0:], netip.MustParseAddr(be.GetAddress()).AsSlice())
	copy(val[16:], netip.MustParseAddr(be.GetNodeAddress()).AsSlice())
	binary.BigEndian.PutUint16(val[32:], port)
	val[34], val[35] = 4, 4
	testnet.Run(t, append(append(append([]string{"bpftool", "map", "update", "pinned", filepath.Join(d.bpffs, "lb", lbxdp.MapBackends), "key"},
		bpftoolBytes(key)...), "value"), bpftoolBytes(val)...)...)
}

// TestFleetCheck: with the file store, lbctl fleet check over the LB nodes' APIs finds
// them in agreement, then reports a backend entry rewritten in one node's map (until
// lbctl node verify repairs it) and a service given to one node only.
func TestFleetCheck(t *testing.T) {
	// No verification pass of its own may repair the planted entry during the test.
	tb := newLB(t, options{verifyInterval: time.Hour})
	lb2 := tb.lbs[1].lbd
	if code, r, errOut := tb.fleetCheck(t); code != 0 || len(r.Diverged) != 0 || len(r.Nodes) != 2 || len(r.Nodes[0].Digests) != 3 {
		t.Fatalf("nodes with the same services: exit %d, %v, %s", code, r, errOut)
	}

	plantBackendPort(t, lb2, "web", 1)
	code, r, errOut := tb.fleetCheck(t)
	if code != 1 || divergedNames(r) != "web" || !strings.Contains(errOut, "differ between the nodes: web") {
		t.Fatalf("a rewritten backend entry on lb2: exit %d, diverged %q, %s", code, divergedNames(r), errOut)
	}
	if d := r.Diverged[0].Digests; d[0].Digest.Table == d[1].Digest.Table || d[0].Digest.Spec != d[1].Digest.Spec {
		t.Errorf("the table digests must differ and the specs agree: %v", d)
	}
	lb2.lbctl(t, "node", "verify")
	if code, r, _ := tb.fleetCheck(t); code != 0 || len(r.Diverged) != 0 {
		t.Fatalf("after lbctl node verify on lb2: exit %d, diverged %q", code, divergedNames(r))
	}

	lb2.lbctl(t, "service", "create", "extra", "--vip", "203.0.113.11", "--port", "80",
		"--backend", netip.AddrPortFrom(tb.backends[0].addr4, httpPort).String())
	tb.waitServiceOn(t, lb2, "extra")
	code, r, _ = tb.fleetCheck(t)
	if code != 1 || divergedNames(r) != "extra" {
		t.Fatalf("a service on lb2 only: exit %d, diverged %q", code, divergedNames(r))
	}
	if d := r.Diverged[0].Digests; d[0].Digest.Spec != "" || d[1].Digest.Spec == "" || d[1].Digest.Table == "" {
		t.Errorf("extra: lb1 must show empty digests, lb2 both: %v", d)
	}
}

// waitServiceOn waits until a daemon's datapath programmed a service.
func (tb *testbed) waitServiceOn(t *testing.T, d *daemon, name string) {
	t.Helper()
	eventually(t, 10*time.Second, func() error {
		if st := d.service(t, name).GetStatus().GetState(); st != lbdv1.ServiceState_SERVICE_STATE_READY {
			return fmt.Errorf("%s on %s is %v", name, d.node.name, st)
		}
		return nil
	})
}
