package docstest

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// A reader of lbd meets references to documents in three forms: Markdown links
// ("[text](docs/operations.md#sizing-a-node)"), paths in code comments and prose
// ("docs/wire-format.md", "deploy-fleet.md"), and section marks after a name
// ("DESIGN.md §2"). Each must lead to a file of this repository, and a link's anchor to a
// heading of that file: a clone of lbd is all a newcomer has.
var (
	mdLink  = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdPath  = regexp.MustCompile(`(?:^|[\s("'` + "`" + `])((?:[A-Za-z0-9_.-]+/)*[A-Za-z0-9_-]+\.md)\b`)
	heading = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
)

// refSources are the files whose references are checked.
func refSources(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root && (strings.HasPrefix(name, ".") || name == "bin" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(name) {
		case ".go", ".c", ".h", ".md", ".proto", ".yaml", ".yml", ".sh", ".tmpl":
		default:
			if name != "Makefile" {
				return nil
			}
		}
		// Generated code repeats what its sources say; the tests of this package use
		// made-up documents (x.md, fixture.md) on purpose.
		if strings.HasSuffix(name, ".pb.go") || strings.HasSuffix(name, "_bpfel.go") ||
			(filepath.Dir(p) == filepath.Join(root, "docs", "docstest") && strings.HasSuffix(name, "_test.go")) {
			return nil
		}
		files = append(files, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// slug is the anchor GitHub gives a heading.
func slug(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	var b strings.Builder
	for _, r := range h {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors lists the heading anchors of a Markdown file (outside code blocks).
func anchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if m := heading.FindStringSubmatch(line); m != nil && !fenced {
			s := slug(m[1])
			if n := seen[s]; n > 0 {
				out[s+"-"+strconv.Itoa(n)] = true
			}
			seen[s]++
			out[s] = true
		}
	}
	return out
}

// resolve finds the file a reference from src names: relative to src's directory, to the
// repository root, or, for a bare name in prose ("config.md"), under docs/.
func resolve(root, src, ref string) (string, bool) {
	bases := []string{filepath.Dir(src), root, filepath.Join(root, "docs")}
	if !strings.Contains(ref, "/") {
		bases = append(bases, filepath.Join(root, "docs", "reference"))
	}
	for _, base := range bases {
		p := filepath.Join(base, ref)
		// A file beside the clone (../shared/...) is not in the repository, even
		// where it happens to exist on the machine that runs the check.
		if r, err := filepath.Rel(root, p); err != nil || r == ".." || strings.HasPrefix(r, ".."+string(filepath.Separator)) {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p, true
		}
	}
	return "", false
}

// TestReferences: every document a file of the repository names exists in it, and every
// link's anchor is a heading there.
func TestReferences(t *testing.T) {
	root := repoRoot(t)
	checked := 0
	for _, src := range refSources(t, root) {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, src)
		for n, line := range strings.Split(string(data), "\n") {
			at := rel + ":" + strconv.Itoa(n+1)
			if filepath.Ext(src) == ".md" {
				for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
					target := m[1]
					if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
						continue
					}
					file, anchor, _ := strings.Cut(target, "#")
					path := src
					if file != "" {
						p, ok := resolve(root, src, file)
						if !ok {
							t.Errorf("%s: link to %s: no such file in the repository", at, file)
							continue
						}
						path = p
					}
					checked++
					if anchor != "" && strings.HasSuffix(path, ".md") && !anchors(t, path)[anchor] {
						t.Errorf("%s: link to %s: no heading with anchor #%s", at, target, anchor)
					}
				}
			}
			for _, m := range mdPath.FindAllStringSubmatch(line, -1) {
				ref := m[1]
				if strings.HasPrefix(ref, "http") {
					continue
				}
				checked++
				if _, ok := resolve(root, src, ref); !ok {
					t.Errorf("%s: names %s, which is not in the repository", at, ref)
				}
			}
		}
	}
	if checked < 100 {
		t.Fatalf("only %d references found: the scan is broken", checked)
	}
	t.Logf("%d references checked", checked)
}

// TestReferencesCatch: the check finds what it is there to find.
func TestReferencesCatch(t *testing.T) {
	cases := map[string]bool{
		"// see DESIGN.md §2":                        true,
		"see [the wire format](docs/wire-format.md)": false,
		"(../shared/TESTBED.md)":                     true,
		"`docs/operations.md`":                       false,
	}
	root := repoRoot(t)
	for line, bad := range cases {
		missing := false
		for _, m := range mdPath.FindAllStringSubmatch(line, -1) {
			if _, ok := resolve(root, filepath.Join(root, "README.md"), m[1]); !ok {
				missing = true
			}
		}
		if missing != bad {
			t.Errorf("%q: missing=%v, want %v", line, missing, bad)
		}
	}
	if a := anchors(t, filepath.Join(root, "docs", "wire-format.md")); !a["size-and-mtu"] || a["no-such-heading"] {
		t.Errorf("anchors of wire-format.md: %v", a)
	}
}
