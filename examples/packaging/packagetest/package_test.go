// Package packagetest builds the release's Debian packages with GoReleaser (a snapshot
// for this machine's architecture, nothing published), installs them with dpkg into a
// throwaway root and checks what an operator gets: binaries of the built version, the
// units (sandboxed as examples/systemd has them, pointing at /usr/bin), the default
// configuration and policy as conffiles that an upgrade keeps, the adapter's user that
// lbd's postinst creates and what it may do through the installed lbd's socket (its
// services, no one else's), and manual pages for every flag and command. `make check-package` runs it, with the GoReleaser that `make release-tools`
// builds; it takes minutes, so `make test` leaves it out.
package packagetest

import (
	"bytes"
	"compress/gzip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/lbd-dev/lbd/daemon/lbd"
	"github.com/lbd-dev/lbd/internal/testnet"
	"github.com/lbd-dev/lbd/lbctl"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// root is the repository's root, relative to this package's directory.
const root = "../../.."

func tool(t *testing.T, env, name string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		return p
	}
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("needs %s (make release-tools builds it; %s names it): not found", name, env)
	}
	return p
}

func run(t *testing.T, dir string, argv ...string) string {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s%s", strings.Join(argv, " "), err, out.String(), errb.String())
	}
	return out.String()
}

func TestDebianPackages(t *testing.T) {
	goreleaser := tool(t, "GORELEASER", "goreleaser")
	for _, name := range []string{"dpkg", "dpkg-deb", "systemd-analyze", "man"} {
		if _, err := exec.LookPath(name); err != nil {
			t.Skipf("needs %s (make deps): %v", name, err)
		}
	}
	repo, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}

	// The release configuration as it is, for this machine's architecture only.
	cfg, err := os.ReadFile(filepath.Join(repo, ".goreleaser.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const arches = "goarch: [amd64, arm64]"
	if !bytes.Contains(cfg, []byte(arches)) {
		t.Fatalf(".goreleaser.yaml has no %q line for the test to narrow", arches)
	}
	cfgPath := filepath.Join(t.TempDir(), "goreleaser.yaml")
	if err := os.WriteFile(cfgPath, bytes.ReplaceAll(cfg, []byte(arches), []byte("goarch: ["+runtime.GOARCH+"]")), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, repo, goreleaser, "release", "--snapshot", "--clean", "--config", cfgPath)

	debs := map[string]string{}
	for _, pkg := range []string{"lbd", "lbd-k8s-adapter"} {
		m, _ := filepath.Glob(filepath.Join(repo, "dist", pkg+"_*_"+runtime.GOARCH+".deb"))
		if len(m) != 1 {
			t.Fatalf("dist/ holds %v for package %s, want one .deb", m, pkg)
		}
		debs[pkg] = m[0]
	}
	version := strings.TrimSpace(run(t, repo, "dpkg-deb", "-f", debs["lbd"], "Version"))

	r := t.TempDir()
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates"} {
		if err := os.MkdirAll(filepath.Join(r, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(r, "var/lib/dpkg/status"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// The maintainer scripts run outside the root, as debhelper's do under DPKG_ROOT
	// (the root holds no shell); the root has no systemd package either, which lbd's
	// postinst needs for systemd-sysusers: the host's runs instead.
	install := func() {
		run(t, repo, "dpkg", "--root="+r, "--force-not-root", "--force-script-chrootless", "--force-depends",
			"-i", debs["lbd"], debs["lbd-k8s-adapter"])
	}
	install()
	status := run(t, repo, "dpkg-query", "--root="+r, "-W", "-f=${Package} ${Status} ${Version}\n")
	for _, pkg := range []string{"lbd", "lbd-k8s-adapter"} {
		if !strings.Contains(status, pkg+" install ok installed "+version+"\n") {
			t.Errorf("dpkg-query: %s is not installed at %s:\n%s", pkg, version, status)
		}
	}
	in := func(p string) string { return filepath.Join(r, p) }
	for pkg, want := range map[string]string{"lbd": "systemd-sysusers", "lbd-k8s-adapter": "lbd"} {
		if deps := run(t, repo, "dpkg-deb", "-f", debs[pkg], "Depends"); !strings.Contains(deps, want) {
			t.Errorf("%s depends on %q, want %s", pkg, deps, want)
		}
	}

	t.Run("binaries", func(t *testing.T) {
		if out := run(t, repo, in("usr/bin/lbd"), "--version"); out != "lbd "+version+"\n" {
			t.Errorf("lbd --version: %q, want the package version %s", out, version)
		}
		if out := run(t, repo, in("usr/bin/lbctl"), "--version"); out != "lbctl "+version+"\n" {
			t.Errorf("lbctl --version: %q, want the package version %s", out, version)
		}
		// The adapter's flag package exits 2 after the usage it prints for --help.
		if out, _ := combined(in("usr/bin/lbd-k8s-adapter"), "--help"); !strings.Contains(out, "Usage: lbd-k8s-adapter [flags]") || !strings.Contains(out, "-kubeconfig") {
			t.Errorf("lbd-k8s-adapter --help: %q", out)
		}
	})

	t.Run("units", func(t *testing.T) {
		host := testnet.HostNS(t)
		units, _ := filepath.Glob(filepath.Join(repo, "examples", "systemd", "*.service"))
		if len(units) == 0 {
			t.Fatal("no unit in examples/systemd")
		}
		for _, src := range units {
			name := filepath.Base(src)
			want, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(in("usr/lib/systemd/system/" + name))
			if err != nil {
				t.Errorf("%s not installed: %v", name, err)
				continue
			}
			if w := bytes.ReplaceAll(want, []byte("/usr/local/bin/"), []byte("/usr/bin/")); !bytes.Equal(got, w) {
				t.Errorf("installed %s differs from examples/systemd/%s with the binaries in /usr/bin", name, name)
			}
			start := regexp.MustCompile(`(?m)^ExecStart=(/usr/bin/\S+)(.*)$`).FindSubmatch(got)
			if start == nil {
				t.Fatalf("%s: no ExecStart of a binary in /usr/bin", name)
			}
			if fi, err := os.Stat(in(string(start[1]))); err != nil || fi.Mode()&0o111 == 0 {
				t.Errorf("%s runs %s, which the packages do not install as an executable (%v)", name, start[1], err)
			}
			// lbd's units: the installed binary accepts the installed configuration, in the
			// root it is installed in (the policy file, the users the postinst created).
			if strings.HasSuffix(string(start[1]), "/lbd") {
				args := strings.Fields(string(start[2]))
				// --check-config checks the host too: run it on one shaped like the examples' (eth0).
				check := host.Command(append([]string{"chroot", r, string(start[1])}, append(args, "--check-config")...)...)
				if out, err := testnet.Output(check); err != nil || out != "configuration is valid\n" {
					t.Errorf("%s: lbd %s --check-config: %q, %v", name, strings.Join(args, " "), out, err)
				}
			}
			out, err := combined("systemd-analyze", "security", "--offline=yes", "--root="+r, "--threshold=30", name)
			if err != nil {
				t.Errorf("systemd-analyze security --root %s: %v\n%s", name, err, out)
			}
			if m := regexp.MustCompile(`Overall exposure level for \S+: (\S+)`).FindStringSubmatch(out); m != nil {
				t.Logf("installed %s: exposure %s", name, m[1])
				stated := regexp.MustCompile(`systemd-analyze security: (\d+\.\d)\)`).FindSubmatch(got)
				if stated == nil || string(stated[1]) != m[1] {
					t.Errorf("installed %s: systemd-analyze says exposure %s, the unit's comment does not state it as (systemd-analyze security: %s)", name, m[1], m[1])
				}
			} else {
				t.Errorf("systemd-analyze security --root %s: no exposure in:\n%s", name, out)
			}
		}
	})

	t.Run("adapter identity", func(t *testing.T) { checkAdapterIdentity(t, r) })

	t.Run("configuration", func(t *testing.T) {
		conffiles := run(t, repo, "dpkg-query", "--root="+r, "-W", "-f=${Conffiles}", "lbd")
		for _, f := range []string{"/etc/lbd/lbd.yaml", "/etc/lbd/policy.yaml"} {
			if !strings.Contains(conffiles, f+" ") {
				t.Errorf("%s is not a conffile of lbd: %q", f, conffiles)
			}
			if fi, err := os.Stat(in(f)); err != nil {
				t.Error(err)
			} else if fi.Mode().Perm() != 0o600 {
				t.Errorf("%s: mode %v, want 0600", f, fi.Mode().Perm())
			}
		}
		// An upgrade (the same package again) keeps what the operator changed.
		edited := []byte("# edited on this node\nstate_dir: /var/lib/lbd\ndatapath: {interfaces: [ens1], lb_sources: [198.18.0.0/24]}\n")
		if err := os.WriteFile(in("etc/lbd/lbd.yaml"), edited, 0o600); err != nil {
			t.Fatal(err)
		}
		install()
		if got, _ := os.ReadFile(in("etc/lbd/lbd.yaml")); !bytes.Equal(got, edited) {
			t.Errorf("reinstalling replaced the edited /etc/lbd/lbd.yaml:\n%s", got)
		}
	})

	t.Run("manual pages", func(t *testing.T) {
		page := manPage(t, in("usr/share/man/man8/lbd.8.gz"))
		lbd.Command().Flags().VisitAll(func(f *pflag.Flag) {
			if !strings.Contains(page, "--"+f.Name) {
				t.Errorf("lbd(8) does not document --%s", f.Name)
			}
		})
		var walk func(c *cobra.Command)
		walk = func(c *cobra.Command) {
			if c.Hidden || c.Name() == "help" {
				return
			}
			file := in("usr/share/man/man1/" + strings.ReplaceAll(c.CommandPath(), " ", "-") + ".1.gz")
			page := manPage(t, file)
			c.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) {
				if !f.Hidden && !strings.Contains(page, "--"+f.Name) {
					t.Errorf("%s does not document --%s", filepath.Base(file), f.Name)
				}
			})
			for _, sub := range c.Commands() {
				walk(sub)
			}
		}
		walk(lbctl.Command())
	})
}

// combined runs a command and returns its output, standard error included.
func combined(argv ...string) (string, error) {
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	return string(out), err
}

// manPage renders an installed manual page with man(1) and returns its text; a page
// that man cannot read or warns about fails the test.
func manPage(t *testing.T, file string) string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Errorf("manual page not installed: %v", err)
		return ""
	}
	defer f.Close()
	if _, err := gzip.NewReader(f); err != nil {
		t.Errorf("%s: not gzip-compressed: %v", file, err)
		return ""
	}
	cmd := exec.Command("man", "--warnings", "-P", "cat", "-l", file)
	cmd.Env = append(os.Environ(), "MANWIDTH=200", "LANG=C.UTF-8")
	var out, warn bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &warn
	if err := cmd.Run(); err != nil || warn.Len() > 0 {
		t.Errorf("man -l %s: %v\n%s", filepath.Base(file), err, warn.String())
	}
	return out.String()
}
