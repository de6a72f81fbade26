package peercred

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestListenerReadsCredentials: a connection accepted by the Listener carries the
// connecting process's uid and groups, and a local address with a port.
func TestListenerReadsCredentials(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l := NewListener(ln)
	defer l.Close()
	go func() {
		c, err := net.Dial("unix", path)
		if err == nil {
			defer c.Close()
			buf := make([]byte, 1)
			c.Read(buf)
		}
	}()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cr := c.(*Conn).Creds
	if cr.UID != uint32(os.Getuid()) || cr.GIDs[0] != uint32(os.Getgid()) || cr.PID != int32(os.Getpid()) {
		t.Errorf("credentials %+v, want uid %d, gid %d, pid %d", cr, os.Getuid(), os.Getgid(), os.Getpid())
	}
	groups, err := os.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		if !slices.Contains(cr.GIDs, uint32(g)) {
			t.Errorf("credentials %+v lack supplementary group %d", cr, g)
		}
	}
	if _, port, err := net.SplitHostPort(c.LocalAddr().String()); err != nil || port != "0" {
		t.Errorf("local address %q: %v, want host and port 0", c.LocalAddr(), err)
	}
}
