package docstest

import (
	"bytes"
	"context"
	"fmt"
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

	"github.com/lbd-dev/lbd/internal/testnet"
)

// repoRoot is the repository root, two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// docBlocks loads the blocks of README.md and docs/.
func docBlocks(t *testing.T, root string) []Block {
	t.Helper()
	blocks, err := Load(root)
	if err != nil {
		t.Fatal(err)
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
		"```sh no-test host",              // 12
		"rm -rf /",                        // 13
		"```",                             // 14
		"- item",                          // 15
		"  ```sh testbed:lbs",             // 16
		"  $ lbctl node get",              // 17
		"  Roles: -",                      // 18
		"  ```",                           // 19
		"```yaml",                         // 20
		"a: b",                            // 21
		"```",                             // 22
	}, "\n")
	blocks, err := Parse("x.md", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range blocks {
		for _, c := range b.Commands {
			got = append(got, fmt.Sprintf("%d:%s", c.Line, c.Text))
		}
	}
	want := []string{
		"3:make help   # x",
		"6:bin/lbctl service create web \\\n  --vip 203.0.113.10",
		"8:cat <<EOF | bash -n\necho hi\nEOF",
		"13:rm -rf /",
		"17:lbctl node get",
	}
	if !slices.Equal(got, want) {
		t.Errorf("commands:\n%q\nwant\n%q", got, want)
	}
	if len(blocks) != 3 || blocks[0].Line != 2 || blocks[1].Line != 12 || blocks[2].Line != 16 {
		t.Fatalf("blocks: %+v", blocks)
	}
	if b := blocks[0]; b.Testbed != "" || b.NoTest != "" {
		t.Errorf("plain block read as %+v", b)
	}
	if b := blocks[1]; b.NoTest != "host" || b.Testbed != "" {
		t.Errorf("no-test block read as %+v", b)
	}
	if b := blocks[2]; b.Testbed != "lbs" || b.NoTest != "" {
		t.Errorf("testbed block read as %+v", b)
	}
	for _, bad := range []string{"```bash", "```sh no-test", "```sh no-test why-not", "```sh testbed:lb9", "```sh testbed", "```sh run"} {
		if _, err := Parse("y.md", []byte(bad+"\nls\n```\n")); err == nil {
			t.Errorf("a block opened by %q was accepted", bad)
		}
	}
}

// TestClassify checks the prefix rules on examples of each class and of none.
func TestClassify(t *testing.T) {
	for text, want := range map[string]Class{
		"make help":                    ClassRun,
		"make demo     # build it all": ClassSyntax,
		"make demo-down":               ClassSyntax,
		"sudo ./bin/lbd --check-config --config examples/lbd.yaml":        ClassRun,
		"bin/lbd --role lb --interface eth0":                              ClassSyntax,
		"LBCTL_SERVER=unix:///tmp/s lbctl service list -o json":           ClassDaemon,
		"lbctl trace tcp 198.18.0.5 1234 203.0.113.10 443":                ClassTestbed,
		"lbctl trace --help":                                              ClassRun,
		"lbctl node get | grep Drained":                                   ClassDaemon,
		"lbctl -o json --server=unix:///tmp/s stats":                      ClassTestbed,
		"lbctl --timeout 5s service list":                                 ClassDaemon,
		"go run ./cmd/lbd --role backend --interface eth0 --check-config": ClassRun,
		"lbd --role lb --interface eth0 -h":                               ClassRun,
		"sysctl -w net.ipv4.conf.all.rp_filter=2":                         ClassTestbed,
		"systemctl restart lbd-lb.service":                                ClassSyntax,
	} {
		if got, _, ok := Classify(text); !ok || got != want {
			t.Errorf("Classify(%q) = %v, %v; want %v", text, got, ok, want)
		}
	}
	for _, text := range []string{"rm -rf /tmp/x", "lbctl", "makefile", "lbctl frobnicate"} {
		if c, _, ok := Classify(text); ok {
			t.Errorf("Classify(%q) = %v; want no class", text, c)
		}
	}
}

// TestCheck checks which blocks may hold which commands.
func TestCheck(t *testing.T) {
	plain, testbed, noTest := Block{}, Block{Testbed: "lb1"}, Block{NoTest: "host"}
	for _, tc := range []struct {
		b    Block
		text string
		ok   bool
	}{
		{plain, "lbctl service get web", true},
		{plain, "make demo", true},
		{plain, "lbctl stats", false},
		{plain, "rm -rf /tmp/x", false},
		{testbed, "lbctl stats", true},
		{testbed, "lbctl service get web", true},
		{testbed, "systemctl restart lbd", false},
		{testbed, "rm -rf /tmp/x", false},
		{noTest, "rm -rf /tmp/x", true},
	} {
		err := tc.b.Check(Command{File: "x.md", Line: 3, Text: tc.text})
		if (err == nil) != tc.ok {
			t.Errorf("%+v.Check(%q) = %v; want ok %v", tc.b, tc.text, err, tc.ok)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "x.md:3: ") {
			t.Errorf("error without file and line: %v", err)
		}
	}
}

// TestDocCommandsClassified fails for every documented command that its block cannot
// run, and logs how many commands each file has per class.
func TestDocCommandsClassified(t *testing.T) {
	root := repoRoot(t)
	n := 0
	var files []string
	counts := map[string]map[string]int{}
	for _, b := range docBlocks(t, root) {
		if counts[b.File] == nil {
			files = append(files, b.File)
			counts[b.File] = map[string]int{}
		}
		for _, c := range b.Commands {
			n++
			if err := b.Check(c); err != nil {
				t.Error(err)
				continue
			}
			switch {
			case b.NoTest != "":
				counts[b.File]["no-test "+b.NoTest]++
			case b.Testbed != "":
				counts[b.File]["testbed"]++
			default:
				cl, _, _ := Classify(c.Text)
				counts[b.File][cl.String()]++
			}
		}
	}
	if n == 0 {
		t.Fatal("no sh command found in README.md and docs/: the extraction is broken")
	}
	for _, f := range files {
		t.Logf("%s: %v", f, counts[f])
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

// TestDocCommands runs the documented commands by class (see commandClasses); the
// commands of testbed blocks are only syntax-checked here, integration.TestDocs runs them.
func TestDocCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("builds lbd, lbctl and the adapter, and runs a daemon")
	}
	root := repoRoot(t)
	blocks := docBlocks(t, root)
	bin := binaries(t, root)

	// Each file gets its own daemon, so that its blocks can build on each other.
	byFile := map[string][]Block{}
	var files []string
	for _, b := range blocks {
		if _, seen := byFile[b.File]; !seen {
			files = append(files, b.File)
		}
		byFile[b.File] = append(byFile[b.File], b)
	}
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			runFile(t, &runner{t: t, root: root, bin: bin}, byFile[f])
		})
	}
}

// runFile runs the blocks of one file in order and stops at the first failure, since
// later commands usually depend on earlier ones.
func runFile(t *testing.T, r *runner, blocks []Block) {
	t.Helper()
	for _, b := range blocks {
		if b.NoTest != "" {
			continue
		}
		for _, c := range b.Commands {
			if err := r.run(b, c); err != nil {
				t.Errorf("%v\n(in the block at %s:%d; the rest of the file is not run)", err, b.File, b.Line)
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
		"make demo",
		"```",
		"```sh testbed:lb1",
		"ip link add lbdx0 type dummy",
		"lbctl stats",
		"```",
		"```sh",
		"$ lbctl node drain",
		"$ lbctl node get",
		"Drained:   yes",
		"$ lbctl service get nope",
		"```",
	}, "\n")
	blocks, err := Parse("fixture.md", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	r := &runner{t: t, root: root, bin: binaries(t, root)}
	type cmd struct {
		b Block
		c Command
	}
	var cmds []cmd
	for _, b := range blocks {
		for _, c := range b.Commands {
			cmds = append(cmds, cmd{b, c})
		}
	}
	if len(cmds) != 12 {
		t.Fatalf("fixture has %d commands, want 12", len(cmds))
	}
	for _, c := range cmds[:11] {
		if err := r.run(c.b, c.c); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(filepath.Join(r.bin, "lbctl"), "--server", "unix://"+r.sock, "node", "get").CombinedOutput()
	if err != nil || !regexp.MustCompile(`Drained:\s+yes`).Match(out) {
		t.Errorf("the daemon did not see the documented drain: %v\n%s", err, out)
	}
	err = r.run(cmds[11].b, cmds[11].c)
	if err == nil || !strings.HasPrefix(err.Error(), "fixture.md:19: daemon command") {
		t.Errorf("a failing command was reported as %v; want fixture.md:19 first", err)
	}
	bad := Block{File: "fixture.md", Line: 1}
	if err := r.run(bad, Command{File: "fixture.md", Line: 2, Text: "lbctl stats"}); err == nil {
		t.Error("a testbed command outside a testbed block ran")
	}
}

// runner runs the commands of one Markdown file.
type runner struct {
	t         *testing.T
	root, bin string
	sock      string      // the daemon's socket once started
	host      *testnet.NS // where --check-config runs, created at its first use
}

// run runs or checks one command of block b; the error starts with the command's file
// and line.
func (r *runner) run(b Block, c Command) error {
	if err := b.Check(c); err != nil {
		return err
	}
	cl, _, _ := Classify(c.Text)
	text := WithBinDir(c.Text, r.bin)
	env := append(os.Environ(), "PATH="+r.bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	args := []string{"-c", text}
	if prog := strings.Fields(Normalize(c.Text))[0]; cl == ClassRun && !r.installed(prog) {
		// As with privileged tests, a missing tool is not a failure; CI installs them all.
		r.t.Logf("%s:%d: %s is not installed: syntax check only", c.File, c.Line, prog)
		cl = ClassSyntax
	}
	if b.Testbed != "" {
		// integration.TestDocs runs it on the testbed's node(s).
		cl = ClassTestbed
	}
	switch cl {
	case ClassSyntax, ClassTestbed:
		args = []string{"-n", "-c", text}
	case ClassDaemon:
		r.startDaemon()
		text = strings.ReplaceAll(text, "/run/lbd/lbd.sock", r.sock)
		args = []string{"-c", text}
		env = append(env, "LBCTL_SERVER=unix://"+r.sock)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", args...)
	if cl == ClassRun && strings.Contains(c.Text, "--check-config") {
		// --check-config checks the host too (the interfaces the configuration names):
		// it runs on a namespace shaped like the examples' host (eth0).
		if os.Geteuid() != 0 {
			r.t.Logf("%s:%d: not root, no namespace shaped like the examples' host: syntax check only", c.File, c.Line)
			args = []string{"-n", "-c", text}
			cmd = exec.CommandContext(ctx, "bash", args...)
		} else {
			if r.host == nil {
				r.host = testnet.HostNS(r.t)
			}
			cmd = r.host.CommandContext(ctx, append([]string{"bash"}, args...)...)
		}
	}
	cmd.Dir, cmd.Env = r.root, env
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s:%d: %s command %q failed: %w\n%s", c.File, c.Line, cl, c.Text, err, out)
	}
	if cl == ClassTestbed && b.Testbed != "" {
		r.t.Logf("%s:%d: syntax only here, integration.TestDocs runs it on %s: %s", c.File, c.Line, b.Testbed, c.Text)
		return nil
	}
	r.t.Logf("%s:%d: %s: %s", c.File, c.Line, cl, c.Text)
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
