package packagetest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/testnet"
)

// checkAdapterIdentity runs the installed lbd (control plane only) with the installed
// configuration and policy, chrooted into the root the packages were installed in, with
// /run/lbd and /var/lib/lbd made as lbd-lb.service has systemd make them; and the
// installed lbctl as the user and group lbd-k8s-adapter.service runs as, which lbd's
// postinst created. Through the socket, that user can apply the services of an owner
// under k8s/, and can neither delete nor replace another owner's, which stay as they
// were; a user outside the socket's group cannot connect.
func checkAdapterIdentity(t *testing.T, r string) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: lbd and lbctl run chrooted into the installed root, lbctl as the adapter's user")
	}
	in := func(p string) string { return filepath.Join(r, p) }
	lb := unitSettings(t, in("usr/lib/systemd/system/lbd-lb.service"))
	adapter := unitSettings(t, in("usr/lib/systemd/system/lbd-k8s-adapter.service"))
	if adapter["User"] == "" || adapter["Group"] == "" {
		t.Fatalf("lbd-k8s-adapter.service sets User=%q, Group=%q: it runs as root, admin on the socket", adapter["User"], adapter["Group"])
	}
	uid := nameID(t, in("etc/passwd"), adapter["User"])
	gid := nameID(t, in("etc/group"), adapter["Group"])
	if uid == 0 || gid == 0 {
		t.Fatalf("lbd-k8s-adapter.service runs as %s:%s (uid %d, gid %d): on the socket, root is admin", adapter["User"], adapter["Group"], uid, gid)
	}
	for _, d := range []struct{ dir, mode string }{
		{"", "0755"}, // the root, a temporary directory of mode 0700
		{"run/" + lb["RuntimeDirectory"], lb["RuntimeDirectoryMode"]},
		{"var/lib/" + lb["StateDirectory"], lb["StateDirectoryMode"]},
		{"tmp", "1777"},
	} {
		mode, err := strconv.ParseUint(d.mode, 8, 32)
		if err != nil {
			t.Fatalf("mode of /%s: %v", d.dir, err)
		}
		if err := os.MkdirAll(in(d.dir), 0o755); err != nil { // /run and /var as on a host
			t.Fatal(err)
		}
		perm := os.FileMode(mode & 0o777)
		if mode&0o1000 != 0 {
			perm |= os.ModeSticky
		}
		if err := os.Chmod(in(d.dir), perm); err != nil {
			t.Fatal(err)
		}
	}

	host := testnet.HostNS(t)
	p := testnet.Start(t, "lbd", filepath.Join(t.TempDir(), "lbd.log"),
		host.Command("chroot", r, "/usr/bin/lbd", "--config", "/etc/lbd/lbd.yaml"))
	// lbctl as root (admin), as the adapter's user, or as nobody.
	lbctl := func(cred *syscall.Credential, args ...string) (string, error) {
		cmd := exec.Command("/usr/bin/lbctl", append([]string{"--server", "/run/lbd/lbd.sock"}, args...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: r, Credential: cred}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	asAdapter := &syscall.Credential{Uid: uid, Gid: gid}
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, err := lbctl(nil, "service", "list")
		if err == nil {
			break
		}
		if !p.Running() || time.Now().After(deadline) {
			t.Fatalf("lbd not serving: %v\n%s\nlbd's log:\n%s", err, out, p.Tail(20))
		}
		time.Sleep(100 * time.Millisecond)
	}
	file := func(owner, name, vip string) string {
		f := "/tmp/" + name + ".yaml"
		data := fmt.Sprintf("owner: %s\nservices:\n  - name: %s\n    vip: %s\n    port: 80\n    protocol: PROTOCOL_TCP\n"+
			"    backends:\n      - {address: 198.18.1.10, port: 8080}\n", owner, name, vip)
		if err := os.WriteFile(in(f), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	if out, err := lbctl(nil, "apply", "-f", file("team-b", "theirs", "203.0.113.20")); err != nil {
		t.Fatalf("root: lbctl apply of team-b's service: %v\n%s", err, out)
	}
	before, err := lbctl(nil, "service", "get", "theirs", "-o", "json")
	if err != nil {
		t.Fatalf("root: lbctl service get: %v\n%s", err, before)
	}
	if out, err := lbctl(asAdapter, "apply", "-f", file("k8s/cluster-a", "mine", "203.0.113.21")); err != nil {
		t.Errorf("%s: lbctl apply of owner k8s/cluster-a: %v\n%s", adapter["User"], err, out)
	}
	for _, args := range [][]string{
		{"service", "delete", "theirs"},
		{"apply", "-f", file("team-b", "theirs", "203.0.113.22")},
	} {
		out, err := lbctl(asAdapter, args...)
		if err == nil || !strings.Contains(out, "PermissionDenied") {
			t.Errorf("%s: lbctl %s: %v, want a refusal (PermissionDenied):\n%s", adapter["User"], strings.Join(args, " "), err, out)
		}
	}
	if after, err := lbctl(nil, "service", "get", "theirs", "-o", "json"); err != nil || after != before {
		t.Errorf("team-b's service after the adapter's attempts (%v):\n%s\nwant:\n%s", err, after, before)
	}
	// The socket's group, not the policy, keeps other users out.
	if out, err := lbctl(&syscall.Credential{Uid: 65534, Gid: 65534}, "service", "list"); err == nil || !strings.Contains(out, "permission denied") {
		t.Errorf("nobody: lbctl service list: %v, want permission denied on the socket:\n%s", err, out)
	}
}

// unitSettings returns the Key=value lines of a unit file (the last one of a repeated key).
func unitSettings(t *testing.T, file string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok && !strings.HasPrefix(k, "#") {
			keys[k] = v
		}
	}
	return keys
}

// nameID returns the ID of a user or group in an /etc/passwd or /etc/group file.
func nameID(t *testing.T, file, name string) uint32 {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Split(line, ":"); len(f) >= 3 && f[0] == name && name != "" {
			id, err := strconv.ParseUint(f[2], 10, 32)
			if err != nil {
				t.Fatalf("%s: %q: %v", file, line, err)
			}
			return uint32(id)
		}
	}
	t.Fatalf("%s has no %q: the packages' scripts did not create it", file, name)
	return 0
}
