// Package examplestest validates the deployment artifacts in examples/: lbd
// configurations, systemd units, router snippets, the container recipe, the Prometheus
// scrape configuration and the Grafana dashboard. Each is checked by the tool that will
// consume it where that tool is installed, and against the code it refers to (flags,
// defaults, metric names) so that the examples cannot drift from lbd.
package examplestest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/lbd-dev/lbd/daemon/config"
	"github.com/lbd-dev/lbd/internal/testnet"
	"sigs.k8s.io/yaml"
)

// root is the repository's root, relative to this package's directory (where go test
// runs the test binary).
const root = "../.."

// binDir holds lbd, lbd-k8s-adapter and lbctl built from this tree by TestMain.
var binDir string

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "lbd-examples-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "create binary dir: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	// The adapter's user runs lbctl from here (TestAdapterIdentity).
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "open binary dir: %v\n", err)
		return 1
	}
	cmd := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "./cmd/lbd", "./cmd/lbd-k8s-adapter", "./cmd/lbctl")
	cmd.Dir = root
	// Static, as the release builds them: TestSystemdUnits runs lbd chrooted.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build lbd, lbd-k8s-adapter and lbctl: %v\n%s", err, out)
		return 1
	}
	binDir = dir
	return m.Run()
}

func path(parts ...string) string { return filepath.Join(append([]string{root}, parts...)...) }

func readFile(t *testing.T, parts ...string) string {
	t.Helper()
	b, err := os.ReadFile(path(parts...))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// needTool returns the path of a tool the check needs, or skips the test naming it. CI
// installs every one of them, so nothing skips there.
func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("needs %s: not installed", name)
	}
	return p
}

// TestLBDConfigs loads every lbd configuration at the top of examples/ with lbd's own
// parser, so a new example is covered as soon as it is added.
func TestLBDConfigs(t *testing.T) {
	files, err := filepath.Glob(path("examples", "*.yaml"))
	if err != nil || len(files) < 2 {
		t.Fatalf("lbd configurations in examples/: %v, %v", files, err)
	}
	for _, f := range files {
		if _, err := config.Load(f); err != nil {
			t.Errorf("%v", err)
		}
	}
}

// unit is a parsed systemd unit: section → key → values in file order.
type unit map[string]map[string][]string

func parseUnit(t *testing.T, file string) unit {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	u := unit{}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" || strings.HasSuffix(line, "\\") {
				t.Fatalf("%s:%d: not a key=value line in a section: %q", file, n, line)
			}
			u[section][strings.TrimSpace(k)] = append(u[section][strings.TrimSpace(k)], strings.TrimSpace(v))
		}
	}
	return u
}

// one returns the single value of a key, failing when it is missing or repeated.
func (u unit) one(t *testing.T, section, key string) string {
	t.Helper()
	v := u[section][key]
	if len(v) != 1 {
		t.Fatalf("[%s] %s: %d values, want 1", section, key, len(v))
	}
	return v[0]
}

// TestSystemdUnits checks the units with systemd-analyze (against binaries built from
// this tree) and runs each ExecStart command line: lbd's with --check-config and the
// configuration the unit's comment names, the adapter's up to the point where it needs a
// cluster.
func TestSystemdUnits(t *testing.T) {
	units := map[string]string{
		"lbd-lb.service":          "lbd",
		"lbd-backend.service":     "lbd",
		"lbd-k8s-adapter.service": "lbd-k8s-adapter",
	}
	// The files the units name on the target host, replaced by what the examples hold.
	adapterCfg := filepath.Join(t.TempDir(), "k8s-adapter.yaml")
	if err := os.WriteFile(adapterCfg, []byte(adapterConfig(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	hostFiles := map[string]string{
		"/etc/lbd/lbd.yaml":         path("examples", "lbd-lb-node.yaml"),
		"/etc/lbd/k8s-adapter.yaml": adapterCfg,
		"/etc/lbd/kubeconfig":       filepath.Join(t.TempDir(), "absent-kubeconfig"),
	}
	def := config.Default()
	for name, bin := range units {
		t.Run(name, func(t *testing.T) {
			file := path("examples", "systemd", name)
			u := parseUnit(t, file)
			args := strings.Fields(u.one(t, "Service", "ExecStart"))
			if want := "/usr/local/bin/" + bin; args[0] != want {
				t.Fatalf("ExecStart runs %s, want %s", args[0], want)
			}
			if got := u.one(t, "Install", "WantedBy"); got != "multi-user.target" {
				t.Errorf("WantedBy=%s, want multi-user.target", got)
			}
			if bin == "lbd" {
				// systemd creates the directories lbd's defaults use.
				if got, want := "/run/"+u.one(t, "Service", "RuntimeDirectory"), filepath.Dir(def.API.Socket); got != want {
					t.Errorf("RuntimeDirectory gives %s, lbd's socket is in %s", got, want)
				}
				if got := "/var/lib/" + u.one(t, "Service", "StateDirectory"); got != def.StateDir {
					t.Errorf("StateDirectory gives %s, lbd's state_dir is %s", got, def.StateDir)
				}
			}
			// A backend node's file is the package's default (an LB node's has BGP), read
			// in a root where the package's files and users are.
			chroot := ""
			if name == "lbd-backend.service" {
				chroot = packageRoot(t)
			}
			for i, a := range args[1:] {
				if f, ok := hostFiles[a]; ok && chroot == "" {
					args[i+1] = f
				}
			}
			runExecStart(t, bin, args[1:], chroot)
			verifyUnit(t, file)
		})
	}
}

// adapterConfig returns the adapter's configuration from examples/k8s/config.yaml.
func adapterConfig(t *testing.T) string {
	t.Helper()
	for _, doc := range strings.Split(readFile(t, "examples", "k8s", "config.yaml"), "\n---\n") {
		var cm struct {
			Data map[string]string `json:"data"`
		}
		if err := yaml.Unmarshal([]byte(doc), &cm); err != nil {
			t.Fatalf("examples/k8s/config.yaml: %v", err)
		}
		if s, ok := cm.Data["k8s-adapter.yaml"]; ok {
			return s
		}
	}
	t.Fatal("examples/k8s/config.yaml has no k8s-adapter.yaml key")
	return ""
}

// packageRoot returns a directory shaped like a node where the lbd package is installed
// (.goreleaser.yaml), for lbd run chrooted into it: lbd as /usr/local/bin/lbd, the
// package's configuration and policy in /etc/lbd, and the users of its sysusers.d file,
// which systemd-sysusers creates there as the package's postinst does on a node.
func packageRoot(t *testing.T) string {
	t.Helper()
	sysusers := needTool(t, "systemd-sysusers")
	r := t.TempDir()
	for src, dst := range map[string]string{
		filepath.Join(binDir, "lbd"):                   "usr/local/bin/lbd",
		path("examples", "packaging", "lbd.yaml"):      "etc/lbd/lbd.yaml",
		path("examples", "packaging", "policy.yaml"):   "etc/lbd/policy.yaml",
		path("examples", "packaging", "sysusers.conf"): "usr/lib/sysusers.d/lbd.conf",
	} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(r, filepath.Dir(dst)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(r, dst), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command(sysusers, "--root="+r, "lbd.conf").CombinedOutput(); err != nil {
		t.Fatalf("systemd-sysusers --root %s lbd.conf: %v\n%s", r, err, out)
	}
	return r
}

// runExecStart runs a unit's command line with the binaries built from this tree, in
// chroot when it is not empty (lbd only).
func runExecStart(t *testing.T, bin string, args []string, chroot string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if bin == "lbd" {
		argv := []string{filepath.Join(binDir, bin)}
		if chroot != "" {
			argv = []string{"chroot", chroot, "/usr/local/bin/lbd"}
		}
		// --check-config checks the host too: run it on one shaped like the examples' (eth0).
		cmd := testnet.HostNS(t).Command(append(argv, append(args, "--check-config")...)...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil || !strings.Contains(stdout.String(), "configuration is valid") {
			t.Fatalf("lbd %s --check-config: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
		}
		return
	}
	// The adapter has no check mode: with a kubeconfig that does not exist it parses its
	// flags (exit 2 on a bad one), loads its configuration, and only then fails (exit 1)
	// on the cluster client.
	cmd := exec.Command(filepath.Join(binDir, bin), args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(stderr.String(), "kubernetes client config") {
		t.Fatalf("%s %s: %v, want exit 1 on the missing kubeconfig only:\n%s", bin, strings.Join(args, " "), err, stderr.String())
	}
}

// verifyUnit runs systemd-analyze verify on a copy of the unit whose commands point at
// the binaries built from this tree (verify checks that they are executable); any
// warning fails the test.
func verifyUnit(t *testing.T, file string) {
	t.Helper()
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze not installed: the unit was checked by the INI parser and by running ExecStart only")
		return
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	cp := filepath.Join(t.TempDir(), filepath.Base(file))
	if err := os.WriteFile(cp, bytes.ReplaceAll(b, []byte("/usr/local/bin/"), []byte(binDir+"/")), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", cp).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify %s: %v\n%s", filepath.Base(file), err, out)
	}
}

// TestRouterConfigs parses the BIRD and FRR snippets with the daemons' own checkers and
// checks that they peer with the LB node of examples/lbd-lb-node.yaml as configured there.
func TestRouterConfigs(t *testing.T) {
	lb, err := config.Load(path("examples", "lbd-lb-node.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	router := lb.BGP.Peers[0]
	vipPrefix := lb.BGP.VIPAttributes[0].Prefix
	t.Run("bird", func(t *testing.T) {
		conf := readFile(t, "examples", "router", "bird.conf")
		for _, want := range []string{
			"router id " + router.Address + ";",
			fmt.Sprintf("local %s as %d;", router.Address, router.AS),
			fmt.Sprintf("neighbor %s as %d;", lb.BGP.RouterID, lb.BGP.LocalAS),
			"passive on;", // lbd's listen_port 0: it only connects out
			"merge paths on;",
			vipPrefix + "{32,32}",
		} {
			if !strings.Contains(conf, want) {
				t.Errorf("bird.conf lacks %q", want)
			}
		}
		bird := needTool(t, "bird")
		if out, err := exec.Command(bird, "-p", "-c", path("examples", "router", "bird.conf")).CombinedOutput(); err != nil {
			t.Errorf("bird -p: %v\n%s", err, out)
		}
	})
	t.Run("frr", func(t *testing.T) {
		conf := readFile(t, "examples", "router", "frr.conf")
		for _, want := range []string{
			fmt.Sprintf("router bgp %d\n", router.AS),
			"bgp router-id " + router.Address + "\n",
			fmt.Sprintf("remote-as %d\n", lb.BGP.LocalAS),
			"neighbor " + lb.BGP.RouterID + " peer-group",
			"neighbor LBD passive\n",
			"maximum-paths",
			"permit " + vipPrefix + " ge 32",
		} {
			if !strings.Contains(conf, want) {
				t.Errorf("frr.conf lacks %q", want)
			}
		}
		vtysh := needTool(t, "vtysh")
		// The exit status says whether the file parsed (2 on an unknown command); the
		// output may also hold a warning about vtysh's own configuration file when not
		// run as root.
		out, err := exec.Command(vtysh, "--dryrun", "--inputfile", path("examples", "router", "frr.conf")).CombinedOutput()
		if err != nil {
			t.Errorf("vtysh --dryrun: %v\n%s", err, out)
		}
	})
}

// TestContainerfile checks the container recipe against the tree: the Go version, the
// commands it builds, the version variables it sets, and the binaries the Kubernetes
// manifests run from the image.
func TestContainerfile(t *testing.T) {
	cf := readFile(t, "examples", "container", "Containerfile")
	goMod := readFile(t, "go.mod")
	goVer := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(goMod)
	if goVer == nil {
		t.Fatal("go.mod has no go directive")
	}
	if want := "golang:" + goVer[1] + "-"; !strings.Contains(cf, want) {
		t.Errorf("Containerfile does not build with %s (go.mod says go %s)", want, goVer[1])
	}
	loop := regexp.MustCompile(`for cmd in ([a-z0-9 -]+);`).FindStringSubmatch(cf)
	if loop == nil {
		t.Fatal("Containerfile: no `for cmd in ...;` build loop")
	}
	built := strings.Fields(loop[1])
	for _, c := range built {
		if _, err := os.Stat(path("cmd", c, "main.go")); err != nil {
			t.Errorf("Containerfile builds ./cmd/%s: %v", c, err)
		}
		if !strings.Contains(cf, "/out/"+c+" ") && !strings.Contains(cf, "/out/"+c+"\n") {
			t.Errorf("Containerfile builds %s but does not copy /out/%s into the image", c, c)
		}
	}
	for _, m := range regexp.MustCompile(`-X (github\.com/lbd-dev/lbd/[a-z/]+)\.([A-Za-z]+)=`).FindAllStringSubmatch(cf, -1) {
		dir := path(strings.TrimPrefix(m[1], "github.com/lbd-dev/lbd/"))
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		found := false
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err == nil && !strings.HasSuffix(f, "_test.go") && regexp.MustCompile(`(?m)^var `+m[2]+` = "`).Match(b) {
				found = true
			}
		}
		if !found {
			t.Errorf("Containerfile sets %s.%s, which is not a string variable there", m[1], m[2])
		}
	}
	// Every binary the manifests run from the lbd image is in it.
	manifests, err := filepath.Glob(path("examples", "k8s", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	binRE := regexp.MustCompile(`command: \[/usr/local/bin/([a-z0-9-]+)`)
	seen := 0
	for _, f := range manifests {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range binRE.FindAllSubmatch(b, -1) {
			seen++
			if !slices.Contains(built, string(m[1])) {
				t.Errorf("%s runs /usr/local/bin/%s, which the Containerfile does not build", filepath.Base(f), m[1])
			}
		}
	}
	if seen == 0 {
		t.Error("no manifest in examples/k8s runs a binary from /usr/local/bin: the pattern no longer matches")
	}
	if !strings.Contains(cf, "/usr/local/bin/") {
		t.Error("Containerfile does not install into /usr/local/bin")
	}
}
