//go:build linux

// Package nsdo runs Go code inside a network namespace, for the tests that build
// topologies of namespaces.
package nsdo

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// Run runs fn on the calling goroutine's OS thread, switched into ns, and switches
// back. Sockets fn opens stay in ns. fn may end the goroutine (t.Fatal): the switch
// back is deferred. A thread that cannot be switched back stays locked, so that the
// runtime discards it instead of reusing it in the wrong namespace.
func Run(ns netns.NsHandle, fn func()) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("get current netns: %w", err)
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter netns: %w", err)
	}
	defer func() {
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
	}()
	fn()
	return nil
}
