package lbctl

import (
	"bytes"
	"strings"
	"testing"
)

// The tests run lbctl in-process against the real API started by apitest.Start.

// result is what one lbctl run produced.
type result struct {
	code           int
	stdout, stderr string
}

// lbctl runs Main in-process against server with the given stdin.
func lbctlIn(t testing.TB, server, stdin string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	if server != "" {
		args = append([]string{"--server", server}, args...)
	}
	code := Main(args, strings.NewReader(stdin), &out, &errOut)
	return result{code: code, stdout: out.String(), stderr: errOut.String()}
}

func lbctl(t testing.TB, server string, args ...string) result {
	t.Helper()
	return lbctlIn(t, server, "", args...)
}

// ok runs lbctl and fails the test unless it succeeds with nothing on stderr.
func ok(t testing.TB, server string, args ...string) string {
	t.Helper()
	r := lbctl(t, server, args...)
	if r.code != ExitOK || r.stderr != "" {
		t.Fatalf("lbctl %s: exit %d, stderr %q, stdout %q", strings.Join(args, " "), r.code, r.stderr, r.stdout)
	}
	return r.stdout
}
