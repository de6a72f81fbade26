// Package docstest runs the shell commands shown in README.md and docs/, so that the
// documentation cannot drift from the code. Every fenced block whose info string is
// `sh` is extracted (a block marked `sh no-test` is not); each command in it is put in a
// class by commandClasses, and a command without a class fails the test, so that a newly
// documented command gets a decision instead of silently going untested.
package docstest

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// class says how the test exercises a documented command.
type class int

const (
	// classRun commands only read the repository and the build (help texts, config
	// checks): they run for real, from the repository root, with bin/ replaced by
	// binaries the test builds.
	classRun class = iota + 1
	// classDaemon commands talk to a running lbd: they run, in document order, against a
	// control-plane-only lbd the test starts for each Markdown file (Unix socket in a
	// temporary directory, LBCTL_SERVER set, /run/lbd/lbd.sock in the command replaced).
	classDaemon
	// classSyntax commands need the netns testbed, root-only network setup, a datapath,
	// a BGP speaker or a cluster, or would recurse into the test suite: only `bash -n`
	// checks them.
	classSyntax
)

func (c class) String() string {
	return map[class]string{classRun: "run", classDaemon: "daemon", classSyntax: "syntax"}[c]
}

// commandClasses classifies a command by its leading words, after `sudo`, variable
// assignments, a bin/ or ./bin/ directory in front of the program, `go run ./cmd/`
// and lbctl's global flags are removed. The longest matching prefix wins; a prefix
// matches whole words only ("make demo" does not match "make demo-down"). Commands of
// a pipeline or list take the class of the first one. Before the table, readOnlyFlags
// makes a command classRun wherever the flag appears.
var commandClasses = []struct {
	prefix string
	class  class
	why    string
}{
	{"make help", classRun, "prints the targets"},
	{"make demo", classSyntax, "builds the netns testbed (root, minutes)"},
	{"make demo-down", classSyntax, "removes the netns testbed"},
	{"make deps", classSyntax, "installs Debian packages (root, network)"},
	{"make build", classSyntax, "writes bin/ in the tree; the test builds its own binaries"},
	{"make check", classSyntax, "the whole CI suite: running it from a test would recurse"},
	{"make test", classSyntax, "the test suite: running it from a test would recurse"},
	{"make integration", classSyntax, "end-to-end tests in network namespaces (root)"},
	{"make bench", classSyntax, "benchmarks: long, and the test suite would recurse"},
	{"make lint", classSyntax, "CI runs it itself"},
	{"make generate", classSyntax, "rewrites committed generated code; CI checks it"},
	{"make check-generated", classSyntax, "CI runs it itself"},
	{"make docs", classSyntax, "rewrites docs/reference; CI runs make check-docs"},
	{"make check-docs", classSyntax, "CI runs it itself"},
	{"make k8s-testbin", classSyntax, "builds kube-apiserver and etcd (minutes)"},
	{"make clean", classSyntax, "removes the tree's bin/"},

	{"lbd --help", classRun, "prints the flags"},
	{"lbd -help", classRun, "prints the flags"},
	{"lbd --version", classRun, "prints the version"},
	{"lbd -version", classRun, "prints the version"},
	{"lbd --check-config", classRun, "validates a configuration file and exits"},
	{"lbd -check-config", classRun, "validates a configuration file and exits"},
	{"lbd", classSyntax, "starts a daemon; with a role it attaches BPF programs (root, interfaces)"},
	{"lbd-k8s-adapter --help", classRun, "prints the flags"},
	{"lbd-k8s-adapter", classSyntax, "needs a Kubernetes apiserver"},

	{"lbctl completion", classRun, "prints a completion script"},
	{"lbctl version", classDaemon, "asks the server its version"},
	{"lbctl service", classDaemon, "services are control-plane state"},
	{"lbctl backend", classDaemon, "backends are control-plane state"},
	{"lbctl bgp peer", classDaemon, "peers are control-plane state"},
	{"lbctl bgp peers", classDaemon, "lists the peers with their sessions"},
	{"lbctl bgp routes", classSyntax, "needs the BGP speaker of an LB node"},
	{"lbctl node get", classDaemon, "reads the node"},
	{"lbctl node drain", classDaemon, "control-plane state"},
	{"lbctl node undrain", classDaemon, "control-plane state"},
	{"lbctl node detach", classSyntax, "removes an attached datapath (root)"},
	{"lbctl stats", classSyntax, "reads datapath counters: needs a role (root)"},
	{"lbctl conntrack", classSyntax, "reads datapath maps: needs a role (root)"},
	{"lbctl trace", classSyntax, "runs the loaded XDP program: needs an LB node (root)"},
	{"go run ./examples/client", classDaemon, "the API client example"},

	{"bird -p", classRun, "parses a BIRD configuration and exits"},
	{"vtysh --dryrun", classRun, "parses an FRR configuration and exits"},

	{"ip", classSyntax, "network setup (root)"},
	{"sysctl", classSyntax, "kernel settings (root)"},
	{"ethtool", classSyntax, "NIC settings (root)"},
	{"tc", classSyntax, "traffic control (root)"},
	{"bpftool", classSyntax, "inspects loaded BPF programs (root)"},
	{"mount", classSyntax, "mounts filesystems (root)"},
	{"systemctl", classSyntax, "needs systemd"},
	{"journalctl", classSyntax, "needs systemd"},
	{"birdc", classSyntax, "needs a running BIRD"},
	{"vtysh", classSyntax, "needs a running FRR"},
	{"kubectl", classSyntax, "needs a Kubernetes cluster"},
	{"docker", classSyntax, "needs a container runtime"},
	{"podman", classSyntax, "needs a container runtime"},
	{"curl", classSyntax, "needs a running node's metrics listener or a VIP"},
}

// readOnlyFlags are flags with which a program only prints or validates and exits,
// wherever they appear on its command line.
var readOnlyFlags = map[string][]string{
	"lbd":             {"--help", "-help", "-h", "--version", "-version", "--check-config", "-check-config"},
	"lbctl":           {"--help", "-h"},
	"lbd-k8s-adapter": {"--help", "-help", "-h"},
}

// command is one command line of a documented block.
type command struct {
	file string // relative to the repository root
	line int    // 1-based line of the command's first line
	text string // continuation lines joined, heredoc bodies included
}

// block is one `sh` fenced block.
type block struct {
	file     string
	line     int // line of the opening fence
	commands []command
}

// fenceRE matches an opening or closing code fence and captures its indentation, its
// marker and its info string.
var fenceRE = regexp.MustCompile("^( *)(```+|~~~+)\\s*(.*)$")

// heredocRE finds a heredoc's terminator word.
var heredocRE = regexp.MustCompile(`<<-?\s*['"]?([A-Za-z_][A-Za-z0-9_]*)['"]?`)

// parseBlocks returns the `sh` blocks of a Markdown document, and an error for blocks
// written with another shell info string, which the test would otherwise skip.
func parseBlocks(file string, data []byte) ([]block, error) {
	var blocks []block
	lines := strings.Split(string(data), "\n")
	for i := 0; i < len(lines); i++ {
		m := fenceRE.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		indent, marker, info := len(m[1]), m[2], strings.Fields(m[3])
		start := i
		var body []string
		for i++; i < len(lines); i++ {
			if c := fenceRE.FindStringSubmatch(lines[i]); c != nil && c[2][0] == marker[0] && len(c[2]) >= len(marker) && strings.TrimSpace(c[3]) == "" {
				break
			}
			l := lines[i]
			l = l[min(indent, len(l)-len(strings.TrimLeft(l, " "))):]
			body = append(body, l)
		}
		if len(info) == 0 {
			continue
		}
		switch info[0] {
		case "sh":
			if slices.Contains(info[1:], "no-test") {
				continue
			}
			blocks = append(blocks, block{file: file, line: start + 1, commands: splitCommands(file, start+2, body)})
		case "bash", "shell", "zsh", "console", "shell-session":
			return nil, fmt.Errorf("%s:%d: shell block marked %q: mark it sh (tested) or sh no-test", file, start+1, info[0])
		}
	}
	return blocks, nil
}

// splitCommands cuts a block's body (whose first line is line first of the file) into
// commands. When some line starts with "$ ", only those lines are commands and the
// others are their output; otherwise every line that is not blank or a comment is.
// Backslash continuations and heredoc bodies belong to their command.
func splitCommands(file string, first int, body []string) []command {
	prompt := slices.ContainsFunc(body, func(l string) bool { return strings.HasPrefix(l, "$ ") })
	var cmds []command
	for i := 0; i < len(body); i++ {
		l := body[i]
		if prompt {
			if !strings.HasPrefix(l, "$ ") {
				continue
			}
			l = strings.TrimPrefix(l, "$ ")
		}
		if t := strings.TrimSpace(l); t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		c := command{file: file, line: first + i, text: l}
		for strings.HasSuffix(c.text, `\`) && i+1 < len(body) {
			i++
			c.text += "\n" + body[i]
		}
		if m := heredocRE.FindStringSubmatch(c.text); m != nil {
			for i+1 < len(body) {
				i++
				c.text += "\n" + body[i]
				if strings.TrimSpace(body[i]) == m[1] {
					break
				}
			}
		}
		cmds = append(cmds, c)
	}
	return cmds
}

var (
	assignRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=\S*\s+`)
	binRE    = regexp.MustCompile(`^((\./)?bin/|go run \./cmd/)`)
)

// normalize returns a command's leading words as commandClasses sees them.
func normalize(text string) string {
	s := strings.Join(strings.Fields(strings.ReplaceAll(text, "\\\n", " ")), " ")
	for {
		switch {
		case strings.HasPrefix(s, "sudo "):
			s = strings.TrimPrefix(s, "sudo ")
		case assignRE.MatchString(s):
			s = assignRE.ReplaceAllString(s, "")
		default:
			return withoutGlobalFlags(binRE.ReplaceAllString(s, ""))
		}
	}
}

// withoutGlobalFlags drops lbctl's global flags (--server X, -o json, --timeout=5s...)
// in front of its subcommand; all of them take a value.
func withoutGlobalFlags(s string) string {
	words := strings.Fields(s)
	if len(words) == 0 || words[0] != "lbctl" {
		return s
	}
	i := 1
	for i < len(words) && strings.HasPrefix(words[i], "-") && words[i] != "--help" && words[i] != "-h" {
		if strings.Contains(words[i], "=") {
			i++
		} else {
			i += 2
		}
	}
	return strings.Join(append([]string{"lbctl"}, words[min(i, len(words)):]...), " ")
}

// classify returns the class of a command; ok is false when no prefix matches.
func classify(text string) (c class, ok bool) {
	s := normalize(text)
	words := strings.Fields(s)
	if len(words) > 0 {
		if flags, ok := readOnlyFlags[words[0]]; ok && slices.ContainsFunc(words[1:], func(w string) bool {
			name, _, _ := strings.Cut(w, "=")
			return slices.Contains(flags, name)
		}) {
			return classRun, true
		}
	}
	best := -1
	for _, e := range commandClasses {
		if (s == e.prefix || strings.HasPrefix(s, e.prefix+" ")) && len(e.prefix) > best {
			c, best = e.class, len(e.prefix)
		}
	}
	return c, best >= 0
}

// repoRoot is the repository root, two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// docBlocks reads README.md and every Markdown file under docs/.
func docBlocks(t *testing.T, root string) []block {
	t.Helper()
	files := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("list docs: %v", err)
	}
	var blocks []block
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatalf("read %s: %v", f, err)
		}
		b, err := parseBlocks(f, data)
		if err != nil {
			t.Error(err)
			continue
		}
		blocks = append(blocks, b...)
	}
	return blocks
}

// TestParseBlocks checks the extraction on a fixed document.
func TestParseBlocks(t *testing.T) {
	doc := strings.Join([]string{
		"# title",                         // 1
		"```sh",                           // 2
		"make help   # x",                 // 3
		"",                                // 4
		"# a comment",                     // 5
		"bin/lbctl service create web \\", // 6
		"  --vip 203.0.113.10",            // 7
		"cat <<EOF | bash -n",             // 8
		"echo hi",                         // 9
		"EOF",                             // 10
		"```",                             // 11
		"```sh no-test",                   // 12
		"rm -rf /",                        // 13
		"```",                             // 14
		"- item",                          // 15
		"  ```sh",                         // 16
		"  $ lbctl node get",              // 17
		"  Roles: -",                      // 18
		"  ```",                           // 19
		"```yaml",                         // 20
		"a: b",                            // 21
		"```",                             // 22
	}, "\n")
	blocks, err := parseBlocks("x.md", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range blocks {
		for _, c := range b.commands {
			got = append(got, fmt.Sprintf("%d:%s", c.line, c.text))
		}
	}
	want := []string{
		"3:make help   # x",
		"6:bin/lbctl service create web \\\n  --vip 203.0.113.10",
		"8:cat <<EOF | bash -n\necho hi\nEOF",
		"17:lbctl node get",
	}
	if !slices.Equal(got, want) {
		t.Errorf("commands:\n%q\nwant\n%q", got, want)
	}
	if len(blocks) != 2 || blocks[0].line != 2 || blocks[1].line != 16 {
		t.Errorf("blocks: %+v", blocks)
	}
	if _, err := parseBlocks("y.md", []byte("```bash\nls\n```\n")); err == nil {
		t.Error("a bash block was accepted")
	}
}

// TestClassify checks the prefix rules on examples of each class and of none.
func TestClassify(t *testing.T) {
	for text, want := range map[string]class{
		"make help":                    classRun,
		"make demo     # build it all": classSyntax,
		"make demo-down":               classSyntax,
		"sudo ./bin/lbd --check-config --config examples/lbd.yaml":        classRun,
		"bin/lbd --role lb --interface eth0":                              classSyntax,
		"LBCTL_SERVER=unix:///tmp/s lbctl service list -o json":           classDaemon,
		"lbctl trace tcp 198.18.0.5 1234 203.0.113.10 443":                classSyntax,
		"lbctl trace --help":                                              classRun,
		"lbctl node get | grep Drained":                                   classDaemon,
		"lbctl -o json --server=unix:///tmp/s stats":                      classSyntax,
		"lbctl --timeout 5s service list":                                 classDaemon,
		"go run ./cmd/lbd --role backend --interface eth0 --check-config": classRun,
		"lbd --role lb --interface eth0 -h":                               classRun,
	} {
		if got, ok := classify(text); !ok || got != want {
			t.Errorf("classify(%q) = %v, %v; want %v", text, got, ok, want)
		}
	}
	for _, text := range []string{"rm -rf /tmp/x", "lbctl", "makefile", "lbctl frobnicate"} {
		if c, ok := classify(text); ok {
			t.Errorf("classify(%q) = %v; want no class", text, c)
		}
	}
}

// TestDocCommandsClassified fails for every documented command without a class.
func TestDocCommandsClassified(t *testing.T) {
	root := repoRoot(t)
	n := 0
	for _, b := range docBlocks(t, root) {
		for _, c := range b.commands {
			n++
			if _, ok := classify(c.text); !ok {
				t.Errorf("%s:%d: %q has no class: add its prefix to commandClasses in docs/docstest/docs_test.go, or mark the block sh no-test", c.file, c.line, c.text)
			}
		}
	}
	if n == 0 {
		t.Fatal("no sh command found in README.md and docs/: the extraction is broken")
	}
}

// buildOnce builds the binaries once for every test of the package.
var buildOnce struct {
	sync.Once
	dir string
	err error
}

// binaries builds lbd, lbctl and the adapter into a directory shared by the tests.
func binaries(t *testing.T, root string) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "docstest-bin")
		if err != nil {
			buildOnce.err = err
			return
		}
		build := exec.Command("go", "build", "-o", dir, "./cmd/lbd", "./cmd/lbctl", "./cmd/lbd-k8s-adapter")
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			buildOnce.err = fmt.Errorf("build binaries: %w\n%s", err, out)
		}
		buildOnce.dir = dir
	})
	if buildOnce.err != nil {
		t.Fatal(buildOnce.err)
	}
	return buildOnce.dir
}

// TestMain removes the shared binaries after the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if buildOnce.dir != "" {
		os.RemoveAll(buildOnce.dir)
	}
	os.Exit(code)
}

// TestDocCommands runs the documented commands by class (see commandClasses).
func TestDocCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("builds lbd, lbctl and the adapter, and runs a daemon")
	}
	root := repoRoot(t)
	blocks := docBlocks(t, root)
	bin := binaries(t, root)

	// Each file gets its own daemon, so that its blocks can build on each other.
	byFile := map[string][]block{}
	var files []string
	for _, b := range blocks {
		if _, seen := byFile[b.file]; !seen {
			files = append(files, b.file)
		}
		byFile[b.file] = append(byFile[b.file], b)
	}
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			runFile(t, &runner{t: t, root: root, bin: bin}, byFile[f])
		})
	}
}

// runFile runs the blocks of one file in order and stops at the first failure, since
// later commands usually depend on earlier ones.
func runFile(t *testing.T, r *runner, blocks []block) {
	t.Helper()
	for _, b := range blocks {
		for _, c := range b.commands {
			if err := r.run(c); err != nil {
				t.Errorf("%v\n(in the block at %s:%d; the rest of the file is not run)", err, b.file, b.line)
				return
			}
		}
	}
}

// TestRunner runs a fixed document through every class, against the real binaries, and
// checks that a failing command is reported with its file and line.
func TestRunner(t *testing.T) {
	if testing.Short() {
		t.Skip("builds lbd, lbctl and the adapter, and runs a daemon")
	}
	root := repoRoot(t)
	doc := strings.Join([]string{
		"```sh",
		"make help | grep -q check",
		"bin/lbd --check-config --config examples/lbd.yaml",
		"./bin/lbctl service --help",
		"lbctl service create web --vip 203.0.113.10 --port 80 --protocol tcp \\",
		"  --backend 198.18.1.10:8080",
		"lbctl --server unix:///run/lbd/lbd.sock backend add web 198.18.1.11:8080",
		"lbctl service get web -o json | grep -q 198.18.1.11",
		"ip link add lbdx0 type dummy",
		"```",
		"```sh",
		"$ lbctl node drain",
		"$ lbctl node get",
		"Drained:   yes",
		"$ lbctl service get nope",
		"```",
	}, "\n")
	blocks, err := parseBlocks("fixture.md", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	r := &runner{t: t, root: root, bin: binaries(t, root)}
	var cmds []command
	for _, b := range blocks {
		cmds = append(cmds, b.commands...)
	}
	if len(cmds) != 10 {
		t.Fatalf("fixture has %d commands, want 10", len(cmds))
	}
	for _, c := range cmds[:9] {
		if err := r.run(c); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(filepath.Join(r.bin, "lbctl"), "--server", "unix://"+r.sock, "node", "get").CombinedOutput()
	if err != nil || !regexp.MustCompile(`Drained:\s+yes`).Match(out) {
		t.Errorf("the daemon did not see the documented drain: %v\n%s", err, out)
	}
	err = r.run(cmds[9])
	if err == nil || !strings.HasPrefix(err.Error(), "fixture.md:15: daemon command") {
		t.Errorf("a failing command was reported as %v; want fixture.md:15 first", err)
	}
}

// runner runs the commands of one Markdown file.
type runner struct {
	t         *testing.T
	root, bin string
	sock      string // the daemon's socket once started
}

// binPathRE finds the repository's bin/ directory in front of a program.
var binPathRE = regexp.MustCompile(`(^|[\s'"=;|&(])(\./)?bin/(lbd|lbctl|lbd-k8s-adapter)\b`)

// run runs or checks one command; the error starts with the command's file and line.
func (r *runner) run(c command) error {
	cl, ok := classify(c.text)
	if !ok {
		return fmt.Errorf("%s:%d: %q has no class (see TestDocCommandsClassified)", c.file, c.line, c.text)
	}
	text := binPathRE.ReplaceAllString(c.text, "${1}"+r.bin+"/${3}")
	env := append(os.Environ(), "PATH="+r.bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	args := []string{"-c", text}
	if prog := strings.Fields(normalize(c.text))[0]; cl == classRun && !r.installed(prog) {
		// As with privileged tests, a missing tool is not a failure; CI installs them all.
		r.t.Logf("%s:%d: %s is not installed: syntax check only", c.file, c.line, prog)
		cl = classSyntax
	}
	switch cl {
	case classSyntax:
		args = []string{"-n", "-c", text}
	case classDaemon:
		r.startDaemon()
		text = strings.ReplaceAll(text, "/run/lbd/lbd.sock", r.sock)
		args = []string{"-c", text}
		env = append(env, "LBCTL_SERVER=unix://"+r.sock)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", args...)
	cmd.Dir, cmd.Env = r.root, env
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s:%d: %s command %q failed: %w\n%s", c.file, c.line, cl, c.text, err, out)
	}
	r.t.Logf("%s:%d: %s: %s", c.file, c.line, cl, c.text)
	return nil
}

// installed reports whether prog is one of the test's binaries or is on PATH.
func (r *runner) installed(prog string) bool {
	if _, err := os.Stat(filepath.Join(r.bin, prog)); err == nil {
		return true
	}
	_, err := exec.LookPath(prog)
	return err == nil
}

// startDaemon starts a control-plane-only lbd for this file, once.
func (r *runner) startDaemon() {
	t := r.t
	t.Helper()
	if r.sock != "" {
		return
	}
	// Unix socket paths are limited to 108 bytes; t.TempDir can be longer.
	sockDir, err := os.MkdirTemp("", "docstest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	r.sock = filepath.Join(sockDir, "lbd.sock")
	var stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(r.bin, "lbd"), "-socket", r.sock, "-state-dir", t.TempDir(), "-metrics-listen=")
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start lbd: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		// Stop this process only, and wait for it.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("lbd (pid %d) log:\n%s", cmd.Process.Pid, stderr.String())
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		if conn, err := net.Dial("unix", r.sock); err == nil {
			conn.Close()
			return
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("lbd exited early (%v):\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("lbd did not listen on %s within 15 s:\n%s", r.sock, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
