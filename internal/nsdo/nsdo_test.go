//go:build linux

package nsdo_test

import (
	"testing"

	"github.com/lbd-dev/lbd/internal/nsdo"
	"github.com/lbd-dev/lbd/internal/testnet"
	"github.com/vishvananda/netns"
)

// TestRun: fn runs in the namespace and the thread comes back to the original one; a
// handle that is no namespace is an error, and fn does not run.
func TestRun(t *testing.T) {
	ns := testnet.NewNS(t, "nsdo-"+testnet.Suffix(t))
	h, err := netns.GetFromName(ns.Name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()

	var inside netns.NsHandle
	var ierr error
	if err := nsdo.Run(h, func() { inside, ierr = netns.Get() }); err != nil || ierr != nil {
		t.Fatalf("Run: %v, %v", err, ierr)
	}
	defer inside.Close()
	if !inside.Equal(h) {
		t.Error("fn did not run in the namespace")
	}
	now, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer now.Close()
	if !now.Equal(orig) {
		t.Error("the thread did not come back to the original namespace")
	}

	ran := false
	if err := nsdo.Run(netns.None(), func() { ran = true }); err == nil || ran {
		t.Errorf("Run with no namespace: %v, fn ran: %v", err, ran)
	}
}
