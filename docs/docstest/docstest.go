// Package docstest extracts the shell commands shown in README.md and docs/ and decides
// how each is exercised, so that the documentation cannot drift from the code. Its own
// tests run what needs no privileges; integration.TestDocs runs the blocks meant for the
// netns testbed.
//
// Every fenced block whose info string starts with `sh` is extracted; the words after
// it say where it runs:
//
//   - `sh`: on the test machine, each command as its class says (Classify): for real,
//     against a control-plane-only lbd, or only syntax-checked.
//   - `sh testbed:WHERE`: inside the netns testbed, on the node(s) TestbedTargets names,
//     in document order, after the blocks before it in the same file and the files
//     before it (Load's order).
//   - `sh no-test REASON`: not run; REASON is one of NoTestReasons, which say why such a
//     command cannot run in any test.
//
// A command without a class, or in a block that cannot run it, is an error, so that a
// newly documented command gets a decision instead of silently going untested.
package docstest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// Class says how a documented command is exercised.
type Class int

const (
	// ClassRun commands only read the repository and the build (help texts, config
	// checks): they run for real, from the repository root, with bin/ replaced by
	// binaries the test builds.
	ClassRun Class = iota + 1
	// ClassDaemon commands talk to a running lbd's control plane: in an `sh` block they
	// run, in document order, against a control-plane-only lbd that the test starts for
	// each Markdown file; in a testbed block, against the node's lbd.
	ClassDaemon
	// ClassTestbed commands need a node with a datapath, a BGP speaker, a router or the
	// node's own network namespace: they belong in a `sh testbed:WHERE` block, where
	// integration.TestDocs runs them; anywhere else they are an error.
	ClassTestbed
	// ClassSyntax commands can run neither on the test machine nor in the testbed: they
	// build or tear down a whole testbed, recurse into the test suite, start daemons,
	// touch the host outside the namespaces or need systemd, a cluster or a container
	// runtime. In an `sh` block only `bash -n` checks them; a testbed block must not
	// hold them.
	ClassSyntax
)

func (c Class) String() string {
	return map[Class]string{ClassRun: "run", ClassDaemon: "daemon", ClassTestbed: "testbed", ClassSyntax: "syntax"}[c]
}

// commandClasses classifies a command by its leading words, after `sudo`, variable
// assignments, a bin/ or ./bin/ directory in front of the program, `go run ./cmd/`
// and lbctl's global flags are removed. The longest matching prefix wins; a prefix
// matches whole words only ("make demo" does not match "make demo-down"). Commands of
// a pipeline or list take the class of the first one. Before the table, readOnlyFlags
// makes a command ClassRun wherever the flag appears.
var commandClasses = []struct {
	prefix string
	class  Class
	why    string
}{
	{"make help", ClassRun, "prints the targets"},
	{"make demo", ClassSyntax, "builds a netns testbed of its own (root, minutes)"},
	{"make demo-down", ClassSyntax, "removes the demo's testbed"},
	{"make deps", ClassSyntax, "installs Debian packages (root, network)"},
	{"make build", ClassSyntax, "writes bin/ in the tree; the test builds its own binaries"},
	{"make check", ClassSyntax, "the whole CI suite: running it from a test would recurse"},
	{"make test", ClassSyntax, "the test suite: running it from a test would recurse"},
	{"make integration", ClassSyntax, "end-to-end tests in network namespaces (root)"},
	{"make bench", ClassSyntax, "benchmarks: long, and the test suite would recurse"},
	{"make lint", ClassSyntax, "CI runs it itself"},
	{"make generate", ClassSyntax, "rewrites committed generated code; CI checks it"},
	{"make check-generated", ClassSyntax, "CI runs it itself"},
	{"make docs", ClassSyntax, "rewrites docs/reference; CI runs make check-docs"},
	{"make check-docs", ClassSyntax, "CI runs it itself"},
	{"make k8s-testbin", ClassSyntax, "builds kube-apiserver and etcd (minutes)"},
	{"make clean", ClassSyntax, "removes the tree's bin/"},

	{"lbd --help", ClassRun, "prints the flags"},
	{"lbd -help", ClassRun, "prints the flags"},
	{"lbd --version", ClassRun, "prints the version"},
	{"lbd -version", ClassRun, "prints the version"},
	{"lbd --check-config", ClassRun, "validates a configuration file and exits"},
	{"lbd -check-config", ClassRun, "validates a configuration file and exits"},
	{"lbd", ClassSyntax, "starts a daemon; the testbed starts its own on every node"},
	{"lbd-k8s-adapter --help", ClassRun, "prints the flags"},
	{"lbd-k8s-adapter", ClassSyntax, "needs a Kubernetes apiserver"},

	{"lbctl completion", ClassRun, "prints a completion script"},
	{"lbctl version", ClassDaemon, "asks the server its version"},
	{"lbctl service", ClassDaemon, "services are control-plane state"},
	{"lbctl backend", ClassDaemon, "backends are control-plane state"},
	{"lbctl bgp peer", ClassDaemon, "peers are control-plane state"},
	{"lbctl bgp peers", ClassDaemon, "lists the peers with their sessions"},
	{"lbctl bgp routes", ClassTestbed, "needs the BGP speaker of an LB node"},
	{"lbctl node get", ClassDaemon, "reads the node"},
	{"lbctl node drain", ClassDaemon, "control-plane state"},
	{"lbctl node undrain", ClassDaemon, "control-plane state"},
	{"lbctl node detach", ClassTestbed, "removes an attached datapath"},
	{"lbctl node verify", ClassTestbed, "reads an attached datapath back"},
	{"lbctl stats", ClassTestbed, "reads datapath counters: needs a role"},
	{"lbctl conntrack", ClassTestbed, "reads datapath maps: needs a role"},
	{"lbctl trace", ClassTestbed, "runs the loaded XDP program: needs an LB node"},
	{"lbctl monitor", ClassTestbed, "reads the LB datapath's packet monitor: needs an LB node"},
	{"lbctl export", ClassDaemon, "writes the services as a file"},
	{"lbctl diff", ClassDaemon, "asks the daemon what an apply would change"},
	{"lbctl apply", ClassDaemon, "services are control-plane state"},
	{"lbctl fleet check", ClassTestbed, "compares what LB nodes' datapaths hold"},
	{"lbctl fleet status", ClassTestbed, "needs a fleet of LB nodes on the etcd store"},
	{"lbctl socket", ClassTestbed, "reads socket-level load balancing maps: needs datapath.socket_lb"},
	{"go run ./examples/client", ClassDaemon, "the API client example"},

	{"bird -p", ClassRun, "parses a BIRD configuration and exits"},
	{"promtool check", ClassRun, "checks Prometheus configuration and rule files"},
	{"promtool test rules", ClassRun, "runs the alert rules' unit tests"},
	{"vtysh --dryrun", ClassRun, "parses an FRR configuration and exits"},

	{"ip", ClassTestbed, "a node's links, addresses, routes and neighbours"},
	{"sysctl", ClassTestbed, "a node's network namespace settings"},
	{"ethtool", ClassTestbed, "a node's NIC settings"},
	{"tc", ClassTestbed, "a node's traffic control"},
	{"bpftool", ClassTestbed, "inspects loaded BPF programs and maps"},
	{"birdc", ClassTestbed, "the testbed's router runs BIRD"},
	{"curl", ClassTestbed, "a node's metrics listener, or a VIP from the client"},
	{"tshark -r", ClassTestbed, "reads a capture a documented command wrote"},
	{"mount", ClassSyntax, "mounts filesystems on the host"},
	{"systemctl", ClassSyntax, "needs systemd"},
	{"journalctl", ClassSyntax, "needs systemd"},
	{"vtysh", ClassSyntax, "needs a running FRR; the testbed's router is BIRD"},
	{"kubectl", ClassSyntax, "needs a Kubernetes cluster"},
	{"docker", ClassSyntax, "needs a container runtime"},
	{"podman", ClassSyntax, "needs a container runtime"},
}

// NoTestReasons are the reasons a block may give for not being run (`sh no-test
// REASON`), and why no test can run such commands.
var NoTestReasons = map[string]string{
	// Installing binaries and units and restarting them would change the machine that
	// runs the tests, outside any namespace; the testbed starts lbd itself.
	"host": "installs files under /usr/local or /etc, or drives systemd, on the machine itself",
	// The image build needs podman or docker and a registry for its base images.
	"container": "needs a container runtime and a registry",
	// kubectl against nodes, DaemonSets and Services needs a real cluster with kubelets;
	// the manifests themselves are validated with kubectl --dry-run=server by another test.
	"cluster": "needs a Kubernetes cluster with nodes",
	// The testbed's router is BIRD; FRR's configuration is parsed by vtysh --dryrun.
	"frr": "needs a running FRR router",
	// The docs testbed runs its LB nodes on the file store; integration.TestFleetEtcd
	// runs these commands against a fleet on a real etcd cluster.
	"etcd": "needs LB nodes on the etcd store of a running etcd cluster",
}

// targetRE matches the places a testbed block can run (see TestbedTargets).
var targetRE = regexp.MustCompile(`^(lb[12]|lbs|be[123]|backends|router|client)$`)

// TestbedTargets describes the WHERE of `sh testbed:WHERE`.
const TestbedTargets = "lb1, lb2: one LB node; lbs: every LB node, each command on each in turn; " +
	"be1..be3: one backend node; backends: every backend node; router: the BIRD router; client: the client"

// Command is one command line of a documented block.
type Command struct {
	File string // relative to the repository root
	Line int    // 1-based line of the command's first line
	Text string // continuation lines joined, heredoc bodies included
}

// Block is one `sh` fenced block.
type Block struct {
	File string
	Line int // line of the opening fence
	// Testbed is WHERE of a `sh testbed:WHERE` block, "" for other blocks.
	Testbed string
	// NoTest is REASON of a `sh no-test REASON` block, "" for other blocks.
	NoTest   string
	Commands []Command
}

// fenceRE matches an opening or closing code fence and captures its indentation, its
// marker and its info string.
var fenceRE = regexp.MustCompile("^( *)(```+|~~~+)\\s*(.*)$")

// heredocRE finds a heredoc's terminator word.
var heredocRE = regexp.MustCompile(`<<-?\s*['"]?([A-Za-z_][A-Za-z0-9_]*)['"]?`)

// Parse returns the `sh` blocks of a Markdown document. It fails on a shell block with
// another info string, which the tests would otherwise skip, and on an `sh` info string
// other than the three forms of the package comment.
func Parse(file string, data []byte) ([]Block, error) {
	var blocks []Block
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
			b := Block{File: file, Line: start + 1, Commands: splitCommands(file, start+2, body)}
			if err := b.setInfo(info[1:]); err != nil {
				return nil, err
			}
			blocks = append(blocks, b)
		case "bash", "shell", "zsh", "console", "shell-session":
			return nil, fmt.Errorf("%s:%d: shell block marked %q: mark it sh, sh testbed:WHERE or sh no-test REASON", file, start+1, info[0])
		}
	}
	return blocks, nil
}

// setInfo reads the words after `sh` in a block's info string.
func (b *Block) setInfo(words []string) error {
	switch {
	case len(words) == 0:
		return nil
	case len(words) == 1 && strings.HasPrefix(words[0], "testbed:"):
		b.Testbed = strings.TrimPrefix(words[0], "testbed:")
		if !targetRE.MatchString(b.Testbed) {
			return fmt.Errorf("%s:%d: unknown testbed target %q (%s)", b.File, b.Line, b.Testbed, TestbedTargets)
		}
		return nil
	case len(words) == 2 && words[0] == "no-test":
		if _, ok := NoTestReasons[words[1]]; !ok {
			return fmt.Errorf("%s:%d: unknown no-test reason %q (one of %s)", b.File, b.Line, words[1], reasonList())
		}
		b.NoTest = words[1]
		return nil
	case len(words) == 1 && words[0] == "no-test":
		return fmt.Errorf("%s:%d: sh no-test without a reason: mark it sh no-test REASON (one of %s)", b.File, b.Line, reasonList())
	}
	return fmt.Errorf("%s:%d: info string %q: want sh, sh testbed:WHERE or sh no-test REASON", b.File, b.Line, "sh "+strings.Join(words, " "))
}

func reasonList() string {
	var r []string
	for k := range NoTestReasons {
		r = append(r, k)
	}
	sort.Strings(r)
	return strings.Join(r, ", ")
}

// splitCommands cuts a block's body (whose first line is line first of the file) into
// commands. When some line starts with "$ ", only those lines are commands and the
// others are their output; otherwise every line that is not blank or a comment is.
// Backslash continuations and heredoc bodies belong to their command.
func splitCommands(file string, first int, body []string) []Command {
	prompt := slices.ContainsFunc(body, func(l string) bool { return strings.HasPrefix(l, "$ ") })
	var cmds []Command
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
		c := Command{File: file, Line: first + i, Text: l}
		for strings.HasSuffix(c.Text, `\`) && i+1 < len(body) {
			i++
			c.Text += "\n" + body[i]
		}
		if m := heredocRE.FindStringSubmatch(c.Text); m != nil {
			for i+1 < len(body) {
				i++
				c.Text += "\n" + body[i]
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

// Normalize returns a command's leading words as the classification sees them, the
// program first.
func Normalize(text string) string {
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

// readOnlyFlags are flags with which a program only prints or validates and exits,
// wherever they appear on its command line.
var readOnlyFlags = map[string][]string{
	"lbd":             {"--help", "-help", "-h", "--version", "-version", "--check-config", "-check-config"},
	"lbctl":           {"--help", "-h"},
	"lbd-k8s-adapter": {"--help", "-help", "-h"},
}

// Classify returns the class of a command and why it has it; ok is false when no
// prefix matches.
func Classify(text string) (c Class, why string, ok bool) {
	s := Normalize(text)
	words := strings.Fields(s)
	if len(words) > 0 {
		if flags, ok := readOnlyFlags[words[0]]; ok && slices.ContainsFunc(words[1:], func(w string) bool {
			name, _, _ := strings.Cut(w, "=")
			return slices.Contains(flags, name)
		}) {
			return ClassRun, "only prints or validates", true
		}
	}
	best := -1
	for _, e := range commandClasses {
		if (s == e.prefix || strings.HasPrefix(s, e.prefix+" ")) && len(e.prefix) > best {
			c, why, best = e.class, e.why, len(e.prefix)
		}
	}
	return c, why, best >= 0
}

// Check returns an error, naming the command's file and line, for a command that its
// block cannot run: one without a class, one that needs the testbed outside a testbed
// block, one that cannot run in the testbed inside one. Commands of no-test blocks are
// not checked.
func (b Block) Check(c Command) error {
	if b.NoTest != "" {
		return nil
	}
	cl, why, ok := Classify(c.Text)
	switch {
	case !ok:
		return fmt.Errorf("%s:%d: %q has no class: add its prefix to commandClasses in docs/docstest/docstest.go, or mark the block sh no-test REASON", c.File, c.Line, c.Text)
	case b.Testbed == "" && cl == ClassTestbed:
		return fmt.Errorf("%s:%d: %q needs the testbed (%s): mark its block sh testbed:WHERE (%s)", c.File, c.Line, c.Text, why, TestbedTargets)
	case b.Testbed != "" && cl == ClassSyntax:
		return fmt.Errorf("%s:%d: %q cannot run in the testbed (%s): move it to an sh or sh no-test REASON block", c.File, c.Line, c.Text, why)
	}
	return nil
}

// Files lists README.md and every Markdown file under docs/, relative to root, in the
// order Load reads them: README.md, then docs/ in lexical order, which is also the
// guides' reading order (deploying comes before operating).
func Files(root string) ([]string, error) {
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
		return nil, fmt.Errorf("list docs: %w", err)
	}
	return files, nil
}

// Load parses every file of Files, in that order. It reads them all and joins their
// errors, so that one run reports every bad block.
func Load(root string) ([]Block, error) {
	files, err := Files(root)
	if err != nil {
		return nil, err
	}
	var blocks []Block
	var errs []error
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			errs = append(errs, fmt.Errorf("read %s: %w", f, err))
			continue
		}
		b, err := Parse(f, data)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		blocks = append(blocks, b...)
	}
	return blocks, errors.Join(errs...)
}

// binPathRE finds the repository's bin/ directory in front of a program.
var binPathRE = regexp.MustCompile(`(^|[\s'"=;|&(])(\./)?bin/(lbd|lbctl|lbd-k8s-adapter)\b`)

// WithBinDir returns a command with the repository's bin/ in front of lbd, lbctl and
// lbd-k8s-adapter replaced by dir, where the test built them.
func WithBinDir(text, dir string) string {
	return binPathRE.ReplaceAllString(text, "${1}"+dir+"/${3}")
}
