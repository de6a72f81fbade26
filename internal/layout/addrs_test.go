package layout

import (
	"bytes"
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// addressParsers are the functions that turn a string into an address, by package path.
var addressParsers = map[string][]string{
	"net/netip": {"ParseAddr", "ParsePrefix", "ParseAddrPort", "MustParseAddr", "MustParsePrefix", "MustParseAddrPort"},
	"net":       {"ParseIP", "ParseCIDR"},
}

// addressBoundaries are the daemon's files that may parse an address from a string,
// each with why: input where it enters lbd. Everywhere else an address travels typed
// (daemon/model; docs/ARCHITECTURE.md, "Addresses: parsed once, where they enter").
var addressBoundaries = map[string]string{
	"daemon/store/validate.go":            "the store's validation: every service and peer that enters the store, from the API, the state file or etcd",
	"daemon/api/api.go":                   "a request's own addresses: a trace's flow, socket-list filters",
	"daemon/api/node_bgp.go":              "a request's peer address, compared with the configuration file's peers",
	"daemon/config/config.go":             "the configuration file",
	"daemon/advertise/config.go":          "the configuration file's bgp section",
	"daemon/bgp/gobgp.go":                 "GoBGP's API answers, which give addresses as strings",
	"daemon/lbd/hostcheck.go":             "--check-config: the configuration file's listen addresses",
	"daemon/model/modeltest/modeltest.go": "test support: model services from messages that tests write",
}

// TestAddressesParsedAtBoundaries fails when a non-test file of the daemon parses an
// address outside addressBoundaries, or when a boundary no longer parses any (the list
// must say where parsing happens today).
func TestAddressesParsedAtBoundaries(t *testing.T) {
	parsing := map[string]bool{}
	for _, file := range daemonGoFiles(t) {
		for _, call := range addressParses(t, file.abs) {
			parsing[file.rel] = true
			if _, ok := addressBoundaries[file.rel]; !ok {
				t.Errorf("%s: %s parses an address; take the typed value from daemon/model (or the config), or name the boundary in addressBoundaries", file.rel, call)
			}
		}
	}
	for _, rel := range slices.Sorted(maps.Keys(addressBoundaries)) {
		if !parsing[rel] {
			t.Errorf("%s is listed as an address boundary but parses no address; take it off the list", rel)
		}
	}
}

type goFile struct{ rel, abs string }

// daemonGoFiles lists the non-test Go files of the daemon's packages.
func daemonGoFiles(t *testing.T) []goFile {
	t.Helper()
	out := goCmd(t, "", "list", "-m", "-f", "{{.Dir}}")
	root := strings.TrimSpace(string(out))
	out = goCmd(t, root, "list", "-json=Dir,GoFiles", "./daemon/...")
	var files []goFile
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			Dir     string
			GoFiles []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		for _, f := range p.GoFiles {
			abs := filepath.Join(p.Dir, f)
			rel, err := filepath.Rel(root, abs)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, goFile{rel: filepath.ToSlash(rel), abs: abs})
		}
	}
	if len(files) == 0 {
		t.Fatal("go list found no file under daemon/")
	}
	return files
}

// addressParses returns the calls of addressParsers in a file, as pkg.Func.
func addressParses(t *testing.T, path string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{} // local name → import path
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		if _, ok := addressParsers[p]; !ok {
			continue
		}
		name := filepath.Base(p)
		if imp.Name != nil {
			name = imp.Name.Name
		}
		names[name] = p
	}
	var calls []string
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		id, ok := sel.X.(*ast.Ident)
		if !ok {
			return true
		}
		if p, ok := names[id.Name]; ok && slices.Contains(addressParsers[p], sel.Sel.Name) {
			calls = append(calls, id.Name+"."+sel.Sel.Name)
		}
		return true
	})
	return calls
}
