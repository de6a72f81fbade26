package lbd_test

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/lbd-dev/lbd/internal/testpki"
)

// Principals for the authorization tests: client certificates for TCP, and real users
// and groups, created for the test, for the Unix socket.

// principalCert issues a client certificate whose identity is a URI SAN, or only its
// subject when uri is empty.
func principalCert(t testing.TB, c *testpki.CA, uri string, subject pkix.Name) tls.Certificate {
	t.Helper()
	return issuePrincipal(t, c, uri, subject).Pair(t)
}

// principalCertPEM is principalCert in PEM form: certificate, key.
func principalCertPEM(t testing.TB, c *testpki.CA, uri string, subject pkix.Name) ([]byte, []byte) {
	t.Helper()
	cert := issuePrincipal(t, c, uri, subject)
	return cert.CertPEM, cert.KeyPEM
}

func issuePrincipal(t testing.TB, c *testpki.CA, uri string, subject pkix.Name) testpki.Issued {
	t.Helper()
	tmpl := &x509.Certificate{Subject: subject, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if uri != "" {
		u, err := url.Parse(uri)
		if err != nil {
			t.Fatalf("parse %s: %v", uri, err)
		}
		tmpl.URIs = []*url.URL{u}
	}
	return c.Issue(t, tmpl)
}

// osUser is a user created for a test.
type osUser struct {
	name     string
	uid, gid uint32
	groups   []uint32
}

func randomSuffix(t *testing.T) string {
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("random: %v", err)
	}
	return hex.EncodeToString(b)
}

// addGroup creates a group, removed at the end of the test.
func addGroup(t *testing.T, name string) uint32 {
	t.Helper()
	if out, err := exec.Command("groupadd", "--system", name).CombinedOutput(); err != nil {
		t.Fatalf("groupadd %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("groupdel", name).CombinedOutput(); err != nil {
			t.Errorf("groupdel %s: %v: %s", name, err, out)
		}
	})
	g, err := user.LookupGroup(name)
	if err != nil {
		t.Fatalf("look up group %s: %v", name, err)
	}
	gid, _ := strconv.ParseUint(g.Gid, 10, 32)
	return uint32(gid)
}

// addUser creates a system user without a home or shell whose primary group is primary
// and who is a member of the supplementary groups; removed at the end of the test.
func addUser(t *testing.T, name, primary string, supplementary ...string) osUser {
	t.Helper()
	args := []string{"--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "-g", primary}
	for _, g := range supplementary {
		args = append(args, "-G", g)
	}
	if out, err := exec.Command("useradd", append(args, name)...).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v: %s", name, err, out)
		}
	})
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatalf("look up user %s: %v", name, err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	ou := osUser{name: name, uid: uint32(uid), gid: uint32(gid)}
	ids, err := u.GroupIds()
	if err != nil {
		t.Fatalf("groups of %s: %v", name, err)
	}
	for _, s := range ids {
		g, _ := strconv.ParseUint(s, 10, 32)
		ou.groups = append(ou.groups, uint32(g))
	}
	return ou
}

func (u osUser) credential() *syscall.Credential {
	return &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups}
}

// connectHelperEnv makes the test binary, started as a helper, connect to the socket it
// names and hand the connection back over file descriptor 3 (TestMain).
const connectHelperEnv = "LBD_TEST_CONNECT_SOCKET"

// connectHelper is the helper's whole life: the connection it makes carries its
// credentials (SO_PEERCRED is taken at connect()), so the parent can make calls as the
// helper's user without changing its own.
func connectHelper(socket string) int {
	c, err := net.Dial("unix", socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, "connect:", err)
		return 1
	}
	f, err := c.(*net.UnixConn).File()
	if err != nil {
		fmt.Fprintln(os.Stderr, "file of connection:", err)
		return 1
	}
	back, err := net.FileConn(os.NewFile(3, "parent"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "parent socket:", err)
		return 1
	}
	if _, _, err := back.(*net.UnixConn).WriteMsgUnix([]byte{0}, syscall.UnixRights(int(f.Fd())), nil); err != nil {
		fmt.Fprintln(os.Stderr, "pass connection:", err)
		return 1
	}
	return 0
}

// helperBin is a copy of the test binary that other users may run (go test's own build
// directory is root's only).
var helperBin string

func copyHelper(dir string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find test binary: %w", err)
	}
	in, err := os.Open(self)
	if err != nil {
		return "", fmt.Errorf("open test binary: %w", err)
	}
	defer in.Close()
	path := filepath.Join(dir, "connect-helper")
	out, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return "", fmt.Errorf("copy test binary: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return "", fmt.Errorf("copy test binary: %w", err)
	}
	return path, out.Close()
}

// dialAs returns a connection to the socket made by a process running as u.
func dialAs(t *testing.T, socket string, u osUser) (net.Conn, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	mine, theirs := os.NewFile(uintptr(fds[0]), "mine"), os.NewFile(uintptr(fds[1]), "theirs")
	defer mine.Close()
	cmd := exec.Command(helperBin)
	cmd.Env = append(os.Environ(), connectHelperEnv+"="+socket)
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: u.credential()}
	out := &syncBuffer{}
	cmd.Stderr = out
	if err := cmd.Start(); err != nil {
		theirs.Close()
		return nil, fmt.Errorf("start helper as %s: %w", u.name, err)
	}
	theirs.Close()
	defer cmd.Wait()
	back, err := net.FileConn(mine)
	if err != nil {
		return nil, fmt.Errorf("socketpair conn: %w", err)
	}
	defer back.Close()
	buf, oob := make([]byte, 1), make([]byte, syscall.CmsgSpace(4))
	_, oobn, _, _, err := back.(*net.UnixConn).ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, fmt.Errorf("receive connection from helper as %s: %w (helper: %s)", u.name, err, out.String())
	}
	msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("helper as %s passed no connection: %v (helper: %s)", u.name, err, out.String())
	}
	got, err := syscall.ParseUnixRights(&msgs[0])
	if err != nil || len(got) != 1 {
		return nil, fmt.Errorf("helper as %s passed no descriptor: %v", u.name, err)
	}
	f := os.NewFile(uintptr(got[0]), "api")
	defer f.Close()
	return net.FileConn(f)
}
