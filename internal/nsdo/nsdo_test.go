//go:build linux

package nsdo

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
)

// TestRun: fn runs in the namespace (it sees only that namespace's interfaces), the
// thread comes back to the original one, and fn's error comes back from RunNamed.
func TestRun(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace")
	}
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	name := "nsdo-" + hex.EncodeToString(b[:])
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()

	var inside netns.NsHandle
	want := errors.New("from fn")
	err = RunNamed(name, func() error {
		if inside, err = netns.Get(); err != nil {
			return err
		}
		return want
	})
	if !errors.Is(err, want) {
		t.Fatalf("RunNamed returned %v, want fn's error", err)
	}
	defer inside.Close()
	if inside.Equal(orig) {
		t.Error("fn ran in the original namespace")
	}
	now, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer now.Close()
	if !now.Equal(orig) {
		t.Error("the thread did not come back to the original namespace")
	}
	if err := RunNamed(name+"-missing", func() error { return nil }); err == nil || !strings.Contains(err.Error(), name+"-missing") {
		t.Errorf("RunNamed of a missing namespace: %v", err)
	}
}
