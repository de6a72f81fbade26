package layout

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// rule is one import rule. Paths are relative to the module; "x/..." is x and every
// package below it, as for the go command. Only imports of this module's packages are
// ruled: any part may use the standard library and third-party modules.
type rule struct {
	pkgs string // the packages the rule is about
	// One of the three is set: the imports pkgs must never have, the only imports they
	// may have, or the only packages that may import them.
	neverImports   []string
	importsOnly    []string
	importedOnlyBy []string
	why            string
}

// rules keep the shape of the repository (docs/ARCHITECTURE.md). Only the imports of
// non-test files count: no test ships in a binary, and tests may reach across to get a
// real peer (lbctl's tests serve the API in process with daemon/apitest, socklb's build
// Maglev tables with daemon/maglev, examples/examplestest reads bpf's counter names).
var rules = []rule{
	{
		pkgs:         "bpf/...",
		neverImports: []string{"daemon/...", "lbctl/...", "cmd/...", "integration/..."},
		why:          "the BPF programs' Go packages sit under the daemon, as its typed map accessors",
	},
	{
		pkgs:         "daemon/...",
		neverImports: []string{"lbctl/...", "cmd/..."},
		why:          "the daemon is a library that cmd/lbd wraps, and lbctl is only its client",
	},
	{
		pkgs:         "lbctl/...",
		neverImports: []string{"daemon/..."},
		why:          "lbctl talks to lbd through proto/ only, so it works with any lbd that speaks the API",
	},
	{
		pkgs:        "proto/...",
		importsOnly: []string{"proto/..."},
		why:         "the API and state schemas are imported by every part and import none",
	},
	{
		pkgs: "bpf/...",
		importedOnlyBy: []string{
			"bpf/...",         // socklb's hooks share lbxdp's service maps and Maglev tables
			"daemon/datapath", // the manager that loads, pins, fills and migrates the maps
		},
		why: "the datapath manager is the only writer of BPF maps",
	},
	{
		pkgs:        "daemon/model",
		importsOnly: []string{"proto/..."},
		why:         "a service as the store accepted it is plain data every part of the daemon reads",
	},
	{
		pkgs:         "daemon/...",
		neverImports: []string{"daemon/model/modeltest"},
		why:          "in the daemon only the store's validation parses a service's addresses; modeltest is for tests below the store",
	},
	{
		pkgs:         "daemon/peercred",
		neverImports: []string{"daemon/...", "proto/..."},
		why:          "who is at the other end of a socket is a fact of the transport, not of lbd's API",
	},
	{
		pkgs:        "daemon/authz",
		importsOnly: []string{"daemon/peercred", "proto/..."},
		why:         "the policy decides on identities and requests alone; it sees stored owners only through the function it is given",
	},
	{
		pkgs:        "daemon/audit",
		importsOnly: []string{"daemon/authz", "proto/..."},
		why:         "the audit trail records calls as the API sees them, whatever serves them",
	},
	{
		pkgs:        "daemon/throttle",
		importsOnly: []string{"daemon/authz"},
		why:         "limits apply to principals, whatever the call",
	},
	{
		pkgs:         "internal/...",
		neverImports: []string{"daemon/...", "lbctl/...", "cmd/..."},
		why:          "internal/ holds test support and shared helpers that any part may use, so it uses none",
	},
}

// TestImportRules fails on every import of a non-test file that breaks a rule.
func TestImportRules(t *testing.T) {
	pkgs := modulePackages(t)
	for _, r := range rules {
		checkPatterns(t, r, pkgs)
	}
	for _, from := range slices.Sorted(maps.Keys(pkgs)) {
		for _, to := range pkgs[from] {
			for _, r := range rules {
				if msg := r.broken(from, to); msg != "" {
					t.Errorf("%s imports %s: %s (%s)", from, to, msg, r.why)
				}
			}
		}
	}
}

// broken says which part of r the import from → to breaks, or "" if none.
func (r rule) broken(from, to string) string {
	switch {
	case r.neverImports != nil:
		if !match(r.pkgs, from) {
			return ""
		}
		for _, never := range r.neverImports {
			if match(never, to) {
				return r.pkgs + " never imports " + never
			}
		}
	case r.importsOnly != nil:
		if match(r.pkgs, from) && !matchAny(r.importsOnly, to) {
			return r.pkgs + " imports only " + strings.Join(r.importsOnly, ", ")
		}
	case r.importedOnlyBy != nil:
		if match(r.pkgs, to) && !matchAny(r.importedOnlyBy, from) {
			return r.pkgs + " is imported only by " + strings.Join(r.importedOnlyBy, ", ")
		}
	}
	return ""
}

// checkPatterns fails on a rule that no longer says anything: a pattern that matches no
// package (a directory moved), or an allowed importer that imports none of r.pkgs (the
// list must say who imports them today, not who once did).
func checkPatterns(t *testing.T, r rule, pkgs map[string][]string) {
	t.Helper()
	for _, p := range slices.Concat([]string{r.pkgs}, r.neverImports, r.importsOnly, r.importedOnlyBy) {
		if !slices.ContainsFunc(slices.Collect(maps.Keys(pkgs)), func(pkg string) bool { return match(p, pkg) }) {
			t.Errorf("rule for %s: %s matches no package of the module", r.pkgs, p)
		}
	}
	for _, importer := range r.importedOnlyBy {
		found := false
		for from, tos := range pkgs {
			if match(importer, from) && slices.ContainsFunc(tos, func(to string) bool { return match(r.pkgs, to) }) {
				found = true
			}
		}
		if !found {
			t.Errorf("rule for %s: %s may import it but does not; take it off the list", r.pkgs, importer)
		}
	}
}

// modulePackages runs go list from the module root and returns every package of the
// module with the module's packages its non-test files import, all relative to the
// module.
func modulePackages(t *testing.T) map[string][]string {
	t.Helper()
	out := goCmd(t, "", "list", "-m", "-f", "{{.Path}}\t{{.Dir}}")
	mod, dir, ok := strings.Cut(strings.TrimSpace(string(out)), "\t")
	if !ok {
		t.Fatalf("go list -m printed %q", out)
	}
	out = goCmd(t, dir, "list", "-json=ImportPath,Imports", "./...")
	pkgs := map[string][]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		var imports []string
		for _, imp := range p.Imports {
			if rel, ok := strings.CutPrefix(imp, mod+"/"); ok {
				imports = append(imports, rel)
			}
		}
		pkgs[strings.TrimPrefix(p.ImportPath, mod+"/")] = imports
	}
	if len(pkgs) == 0 {
		t.Fatal("go list found no package")
	}
	return pkgs
}

func goCmd(t *testing.T, dir string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, ee.Stderr)
		}
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	return out
}

func match(pattern, pkg string) bool {
	if dir, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == dir || strings.HasPrefix(pkg, dir+"/")
	}
	return pkg == pattern
}

func matchAny(patterns []string, pkg string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return match(p, pkg) })
}
