package lbctl

import (
	"fmt"
	"strings"
	"testing"

	"github.com/lbd-dev/lbd/daemon/apitest"
)

// completions runs the hidden command shells call on <TAB> and returns the proposals.
func completions(t *testing.T, srv string, args ...string) []string {
	t.Helper()
	r := lbctl(t, srv, append([]string{"__complete"}, args...)...)
	if r.code != ExitOK {
		t.Fatalf("__complete %v: exit %d, stderr %q", args, r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	// The last line is the directive, e.g. ":4" (no file completion).
	if last := lines[len(lines)-1]; last != ":4" {
		t.Errorf("__complete %v: directive %q, want :4", args, last)
	}
	return lines[:len(lines)-1]
}

func TestCompletion(t *testing.T) {
	t.Parallel()
	srv := apitest.Start(t)
	for _, shell := range []struct{ name, want string }{
		{"bash", "# bash completion V2 for lbctl"},
		{"zsh", "#compdef lbctl"},
		{"fish", "complete -c lbctl"},
	} {
		r := lbctl(t, "", "completion", shell.name)
		if r.code != ExitOK || !strings.Contains(r.stdout, shell.want) || r.stderr != "" {
			t.Errorf("completion %s: exit %d, stderr %q, stdout lacks %q", shell.name, r.code, r.stderr, shell.want)
		}
	}
	if r := lbctl(t, "", "completion", "tcsh"); r.code != ExitUsage || r.stdout != "" {
		t.Errorf("completion tcsh: exit %d, stdout %q", r.code, r.stdout)
	}

	ok(t, srv, "service", "create", "web", "--vip", "203.0.113.10", "--port", "80",
		"--backend", "198.18.1.10:80", "--backend", "198.18.1.9:80")
	ok(t, srv, "service", "create", "api", "--vip", "203.0.113.11", "--port", "80")
	ok(t, srv, "bgp", "peer", "add", "198.18.0.1", "--as", "65000")
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"service", "get", ""}, []string{"api", "web"}},
		{[]string{"service", "delete", "w"}, []string{"web"}},
		{[]string{"service", "get", "api", ""}, nil},
		{[]string{"backend", "drain", "web", ""}, []string{"198.18.1.9:80", "198.18.1.10:80"}},
		{[]string{"backend", "drain", "nope", ""}, nil},
		{[]string{"bgp", "peer", "delete", ""}, []string{"198.18.0.1"}},
		{[]string{"service", "list", "-o", ""}, []string{"table", "json", "yaml"}},
		{[]string{"service", "create", "x", "--hash-mode", ""}, []string{"five-tuple", "source-address"}},
		{[]string{"backend", "add", "web", "198.18.1.1:80", "--state", ""}, []string{"active", "draining", "disabled"}},
	} {
		got := completions(t, srv, tc.args...)
		if fmt.Sprint(got) != fmt.Sprint(tc.want) && !(len(got) == 0 && len(tc.want) == 0) {
			t.Errorf("__complete %q = %q, want %q", tc.args, got, tc.want)
		}
	}
}
