package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/k8stest"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// examplesDir is the repository's examples/, relative to this package's directory (where
// go test runs the test binary).
const examplesDir = "../../examples"

// object is one document of a Kubernetes manifest.
type object struct {
	doc        []byte
	apiVersion string
	kind       string
	name       string
}

// ref is how "kubectl -o name" names the object: lower-case kind.group/name.
func (o object) ref() string {
	kind := o.kind
	if group, _, ok := strings.Cut(o.apiVersion, "/"); ok {
		kind += "." + group
	}
	return strings.ToLower(kind) + "/" + o.name
}

// manifest is a file under examples/ that holds Kubernetes objects.
type manifest struct {
	path    string // as kubectl is given it
	rel     string // below examples/
	objects []object
}

// findManifests returns every file under examples/ whose documents are Kubernetes
// objects (they have an apiVersion and a kind), so a manifest added anywhere is checked
// without editing the test. Every YAML file in examples/k8s/ must be one.
func findManifests(t *testing.T) []manifest {
	t.Helper()
	var found []manifest
	err := filepath.WalkDir(examplesDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		switch filepath.Ext(path) {
		case ".yaml", ".yml", ".json":
		default:
			return nil
		}
		rel, err := filepath.Rel(examplesDir, path)
		if err != nil {
			return fmt.Errorf("relative path of %s: %w", path, err)
		}
		objects, other, err := readObjects(path)
		if err != nil {
			return err
		}
		switch {
		case len(objects) > 0 && other > 0:
			return fmt.Errorf("%s: %d documents are Kubernetes objects and %d are not", rel, len(objects), other)
		case len(objects) > 0:
			found = append(found, manifest{path: path, rel: rel, objects: objects})
		case filepath.Dir(rel) == "k8s":
			return fmt.Errorf("%s: no Kubernetes object (apiVersion and kind) in a file of examples/k8s", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("find manifests in %s: %v", examplesDir, err)
	}
	if len(found) == 0 {
		t.Fatalf("no Kubernetes manifest in %s", examplesDir)
	}
	return found
}

// readObjects splits a file into its YAML documents and returns those that are
// Kubernetes objects, and how many non-empty documents are not.
func readObjects(path string) ([]object, int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, fmt.Errorf("read manifest: %w", err)
	}
	var objects []object
	other := 0
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objects, other, nil
		}
		if err != nil {
			return nil, 0, fmt.Errorf("split %s into documents: %w", path, err)
		}
		var v any
		if err := yaml.Unmarshal(doc, &v); err != nil {
			return nil, 0, fmt.Errorf("parse %s: %w", path, err)
		}
		if v == nil { // empty, or comments only
			continue
		}
		fields, _ := v.(map[string]any)
		apiVersion, _ := fields["apiVersion"].(string)
		kind, _ := fields["kind"].(string)
		if apiVersion == "" || kind == "" {
			other++
			continue
		}
		metadata, _ := fields["metadata"].(map[string]any)
		name, _ := metadata["name"].(string)
		objects = append(objects, object{doc: doc, apiVersion: apiVersion, kind: kind, name: name})
	}
}

// kubectl runs the kubectl built with the test binaries against the test cluster.
type kubectl struct {
	t          *testing.T
	path       string
	kubeconfig string
	cacheDir   string
}

// run returns kubectl's stdout and stderr; err is set when it exits with an error.
func (k kubectl) run(args ...string) (stdout, stderr string, err error) {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args = append([]string{"--kubeconfig", k.kubeconfig, "--cache-dir", k.cacheDir}, args...)
	cmd := exec.CommandContext(ctx, k.path, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.String(), errOut.String(), fmt.Errorf("kubectl %s: %w", strings.Join(args, " "), err)
	}
	return out.String(), errOut.String(), nil
}

// dryRunArgs are those of the check: the server runs validation, defaulting and admission
// on every object and persists nothing; unknown and duplicate fields are errors.
var dryRunArgs = []string{"apply", "--dry-run=server", "--validate=strict", "-o", "name"}

// TestManifestsServerDryRun has a real kube-apiserver accept every object of every
// Kubernetes manifest in examples/ through "kubectl apply --dry-run=server
// --validate=strict", as an operator would apply them, with nothing printed on stderr
// (errors and warnings alike). A copy of a manifest with an unknown field must be
// rejected, naming the field, so the check is known to bite.
func TestManifestsServerDryRun(t *testing.T) {
	manifests := findManifests(t)
	if why := k8stest.Missing(); why != "" {
		t.Skip(why)
	}
	if why := k8stest.MissingKubectl(); why != "" {
		t.Skip(why)
	}
	cluster, err := k8stest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cluster.Stop(); err != nil {
			t.Error(err)
		}
	}()
	dir := t.TempDir()
	k := kubectl{t: t, path: k8stest.Kubectl(), kubeconfig: filepath.Join(dir, "kubeconfig"), cacheDir: filepath.Join(dir, "cache")}
	if err := cluster.WriteKubeconfig(k.kubeconfig); err != nil {
		t.Fatal(err)
	}

	// A server dry run persists nothing, so the objects in a Namespace that the same
	// manifests declare would be rejected for want of it: the Namespaces are applied for
	// real first, as declared (and still dry-run again below with their manifest).
	var namespaces [][]byte
	for _, m := range manifests {
		for _, o := range m.objects {
			if o.kind == "Namespace" && o.apiVersion == "v1" {
				namespaces = append(namespaces, o.doc)
			}
		}
	}
	if len(namespaces) > 0 {
		nsFile := filepath.Join(dir, "namespaces.yaml")
		if err := os.WriteFile(nsFile, bytes.Join(namespaces, []byte("---\n")), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, stderr, err := k.run("apply", "--validate=strict", "-f", nsFile); err != nil || stderr != "" {
			t.Fatalf("create the manifests' namespaces: %v\n%s", err, stderr)
		}
	}

	accepted := 0
	for _, m := range manifests {
		t.Run(m.rel, func(t *testing.T) {
			stdout, stderr, err := k.run(append(dryRunArgs, "-f", m.path)...)
			if err != nil || stderr != "" {
				t.Fatalf("%s not accepted: %v\n%s", m.rel, err, stderr)
			}
			var got, want []string
			for line := range strings.Lines(stdout) {
				if f := strings.Fields(line); len(f) > 0 {
					got = append(got, f[0])
				}
			}
			for _, o := range m.objects {
				want = append(want, o.ref())
			}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("%s: kubectl applied %q, want every object of the file %q", m.rel, got, want)
			}
			accepted += len(got)
			t.Logf("%s: %d objects accepted: %s", m.rel, len(got), strings.Join(got, " "))
		})
	}
	t.Logf("kube-apiserver %s accepted %d objects from %d manifests", k8stest.Version, accepted, len(manifests))

	t.Run("unknown field is rejected", func(t *testing.T) {
		broken, field := breakWorkload(t, manifests)
		file := filepath.Join(dir, "broken.yaml")
		if err := os.WriteFile(file, broken, 0o600); err != nil {
			t.Fatal(err)
		}
		_, stderr, err := k.run(append(dryRunArgs, "-f", file)...)
		if err == nil {
			t.Fatalf("a manifest with the unknown field %s was accepted", field)
		}
		if want := fmt.Sprintf("unknown field %q", field); !strings.Contains(stderr, want) {
			t.Fatalf("kubectl failed (%v) without saying %s:\n%s", err, want, stderr)
		}
		t.Logf("rejected: %s", strings.TrimSpace(stderr))
	})
}

// breakWorkload returns a copy of the first object of the manifests that has a pod
// template, with an unknown field added to the pod spec, and that field's path as the
// apiserver names it.
func breakWorkload(t *testing.T, manifests []manifest) ([]byte, string) {
	t.Helper()
	const field = "lbdNoSuchField"
	for _, m := range manifests {
		for _, o := range m.objects {
			var obj map[string]any
			if err := yaml.Unmarshal(o.doc, &obj); err != nil {
				t.Fatalf("%s: %v", m.rel, err)
			}
			spec, _ := obj["spec"].(map[string]any)
			template, _ := spec["template"].(map[string]any)
			podSpec, ok := template["spec"].(map[string]any)
			if !ok {
				continue
			}
			podSpec[field] = true
			b, err := yaml.Marshal(obj)
			if err != nil {
				t.Fatalf("encode %s %s: %v", o.kind, o.name, err)
			}
			return b, "spec.template.spec." + field
		}
	}
	t.Fatal("no object with a pod template in the manifests to break")
	return nil, ""
}
