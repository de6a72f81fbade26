package docstest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// usage is a command line of lbd or lbctl that the documentation shows.
type usage struct {
	where string // file:line
	prog  string // lbd or lbctl
	args  []string
}

var (
	// codeSpanRE finds inline code that runs lbd or lbctl, as prose shows it.
	codeSpanRE = regexp.MustCompile("`((?:lbd|lbctl) [^`]+)`")
	// progRE strips what may stand before the program's name.
	progRE = regexp.MustCompile(`^(?:sudo\s+)?(?:[A-Z_]+=\S*\s+)*(?:go run \./cmd/|\./bin/|bin/|/usr/local/bin/|/usr/bin/)?(lbd|lbctl)\b`)
)

// documentedUsages returns every lbd and lbctl command line of README.md and docs/
// (not the generated reference): commands of sh blocks, and inline code spans.
func documentedUsages(t *testing.T, root string) []usage {
	t.Helper()
	var out []usage
	add := func(where, line string) {
		line = strings.TrimSpace(line)
		m := progRE.FindStringSubmatchIndex(line)
		if m == nil {
			return
		}
		prog := line[m[2]:m[3]]
		rest := line[m[1]:]
		// One command: up to a pipe, a list operator or a comment.
		if i := strings.IndexAny(rest, "|;&#"); i >= 0 {
			rest = rest[:i]
		}
		out = append(out, usage{where: where, prog: prog, args: strings.Fields(rest)})
	}
	for _, b := range docBlocks(t, root) {
		for _, c := range b.Commands {
			add(fmt.Sprintf("%s:%d", c.File, c.Line), strings.ReplaceAll(c.Text, "\\\n", " "))
		}
	}
	files := []string{filepath.Join(root, "README.md")}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range append(files, more...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range codeSpanRE.FindAllStringSubmatch(line, -1) {
				add(fmt.Sprintf("%s:%d", rel, i+1), m[1])
			}
		}
	}
	return out
}

// helpFlags lists the flags a --help text shows: Go's flag package ("  -name type") or
// cobra's ("  -s, --name type"), both sections of cobra's (Flags, Global Flags).
var helpFlagRE = regexp.MustCompile(`(?m)^\s+(?:-([a-zA-Z]), )?--?([a-z0-9][a-z0-9-]*)`)

func helpFlags(help string) []string {
	var out []string
	for _, m := range helpFlagRE.FindAllStringSubmatch(help, -1) {
		if m[1] != "" {
			out = append(out, m[1])
		}
		out = append(out, m[2])
	}
	return out
}

// helpOf runs a program with --help after args and returns what it prints.
func helpOf(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, _ := exec.Command(bin, append(args, "--help")...).CombinedOutput()
	if !strings.Contains(string(out), "Usage") {
		t.Fatalf("%s %s --help printed no usage:\n%s", filepath.Base(bin), strings.Join(args, " "), out)
	}
	return string(out)
}

// TestDocumentedFlags: every flag that README.md and docs/ give lbd or lbctl is one that
// the program's --help lists (for lbctl, the --help of the very command it is given to),
// and the configuration reference lists every flag of lbd --help.
func TestDocumentedFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds lbd and lbctl")
	}
	root := repoRoot(t)
	bin := binaries(t, root)
	lbdFlags := helpFlags(helpOf(t, filepath.Join(bin, "lbd")))
	if !slices.Contains(lbdFlags, "check-config") || !slices.Contains(lbdFlags, "interface") {
		t.Fatalf("lbd --help: found only %v: the pattern no longer matches its help", lbdFlags)
	}

	// lbctl: the command path is the leading words that --help lists as subcommands.
	type cmdHelp struct{ subs, flags []string }
	cache := map[string]cmdHelp{}
	lbctlHelp := func(path []string) cmdHelp {
		key := strings.Join(path, " ")
		if h, ok := cache[key]; ok {
			return h
		}
		text := helpOf(t, filepath.Join(bin, "lbctl"), path...)
		var h cmdHelp
		if _, cmds, ok := strings.Cut(text, "Available Commands:\n"); ok {
			for _, line := range strings.Split(cmds, "\n") {
				f := strings.Fields(line)
				if len(f) == 0 || !strings.HasPrefix(line, "  ") {
					break
				}
				h.subs = append(h.subs, f[0])
			}
		}
		if _, flags, ok := strings.Cut(text, "Flags:\n"); ok {
			h.flags = helpFlags(flags)
		}
		cache[key] = h
		return h
	}

	usages := documentedUsages(t, root)
	checked := map[string]int{}
	for _, u := range usages {
		known := lbdFlags
		cmd := u.prog
		if u.prog == "lbctl" {
			var path []string
			for _, a := range u.args {
				if strings.HasPrefix(a, "-") || !slices.Contains(lbctlHelp(path).subs, a) {
					break
				}
				path = append(path, a)
			}
			known = lbctlHelp(path).flags
			cmd = strings.Join(append([]string{"lbctl"}, path...), " ")
		}
		for _, a := range u.args {
			if !strings.HasPrefix(a, "-") || a == "-" || a == "--" {
				continue
			}
			name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if regexp.MustCompile(`^[0-9]`).MatchString(name) || name == "" {
				continue // a negative number, not a flag
			}
			checked[u.prog]++
			if !slices.Contains(known, name) {
				t.Errorf("%s: %s %s: %s --help has no flag %s", u.where, u.prog, strings.Join(u.args, " "), cmd, a)
			}
		}
	}
	// A floor: the extraction must keep finding the documented flags.
	if checked["lbd"] < 10 || checked["lbctl"] < 5 {
		t.Fatalf("only %v documented flags found in %d command lines: the extraction no longer works", checked, len(usages))
	}

	ref, err := os.ReadFile(filepath.Join(root, "docs", "reference", "config.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range lbdFlags {
		if len(f) > 1 && f != "help" && !strings.Contains(string(ref), "| `--"+f+"` |") {
			t.Errorf("docs/reference/config.md does not list lbd's flag --%s (make docs)", f)
		}
	}
}
