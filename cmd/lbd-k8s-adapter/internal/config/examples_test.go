package config

import (
	"bufio"
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/nodeconfig"
	lbdconfig "github.com/lbd-dev/lbd/daemon/config"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
)

const examplesDir = "../../../../examples/k8s"

// exampleNode is the node the templates are rendered for.
var exampleNode = nodeconfig.Node{Name: "edge-1", IPs: []netip.Addr{netip.MustParseAddr("198.18.0.11"), netip.MustParseAddr("2001:db8:f::11")}}

// TestExampleManifests decodes every object of examples/k8s strictly (a misspelt field
// fails) and checks that the configuration files inside the ConfigMaps are valid for the
// adapter and for lbd.
func TestExampleManifests(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(examplesDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", examplesDir, err)
	}
	decoder := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	adapterConfigs := 0
	configMaps := map[string]*corev1.ConfigMap{}
	var daemonSets []*appsv1.DaemonSet
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for {
			doc, err := r.Read()
			if err != nil {
				break
			}
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			obj, _, err := decoder.Decode(doc, nil, nil)
			if err != nil {
				t.Errorf("%s: %v", filepath.Base(f), err)
				continue
			}
			adapterConfigs += checkConfigMap(t, filepath.Base(f), obj)
			switch o := obj.(type) {
			case *corev1.ConfigMap:
				configMaps[o.Name] = o
			case *appsv1.DaemonSet:
				daemonSets = append(daemonSets, o)
			}
		}
	}
	if adapterConfigs != 1 {
		t.Errorf("found %d adapter configs in the ConfigMaps, want 1", adapterConfigs)
	}
	if len(daemonSets) == 0 {
		t.Fatal("no DaemonSet in the manifests")
	}
	for _, ds := range daemonSets {
		checkConfigPaths(t, ds, configMaps)
	}
}

// checkConfigPaths checks that every file a container of the DaemonSet is given on its
// command line under a ConfigMap volume's mount is a key of that ConfigMap, so a renamed
// key or a misspelt path fails here rather than in a crash-looping pod.
func checkConfigPaths(t *testing.T, ds *appsv1.DaemonSet, configMaps map[string]*corev1.ConfigMap) {
	t.Helper()
	spec := ds.Spec.Template.Spec
	volumes := map[string]string{} // volume name → ConfigMap name
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil {
			volumes[v.Name] = v.ConfigMap.Name
		}
	}
	checked := 0
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		for _, m := range c.VolumeMounts {
			cmName, ok := volumes[m.Name]
			if !ok {
				continue
			}
			for _, arg := range c.Command {
				if i := strings.IndexByte(arg, '='); i >= 0 {
					arg = arg[i+1:]
				}
				if filepath.Dir(arg) != m.MountPath {
					continue
				}
				checked++
				cm := configMaps[cmName]
				if cm == nil {
					t.Errorf("DaemonSet %s: container %s mounts ConfigMap %s, which no manifest defines", ds.Name, c.Name, cmName)
				} else if _, ok := cm.Data[filepath.Base(arg)]; !ok {
					t.Errorf("DaemonSet %s: container %s reads %s, but ConfigMap %s has no key %q", ds.Name, c.Name, arg, cmName, filepath.Base(arg))
				}
			}
		}
	}
	if checked == 0 {
		t.Errorf("DaemonSet %s: no container reads a file of a ConfigMap", ds.Name)
	}
}

func checkConfigMap(t *testing.T, file string, obj runtime.Object) int {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return 0
	}
	n := 0
	// The keys as the containers see them where the ConfigMap is mounted (lbd's policy
	// file): lbd's configuration names them there.
	dir := t.TempDir()
	mounted := map[string]string{}
	for key, val := range cm.Data {
		path := filepath.Join(dir, key)
		if err := os.WriteFile(path, []byte(val), 0o600); err != nil {
			t.Fatal(err)
		}
		mounted[templateMount+"/"+key] = path
	}
	for key := range cm.Data {
		path := filepath.Join(dir, key)
		switch key {
		case "k8s-adapter.yaml":
			n++
			if _, err := Load(path); err != nil {
				t.Errorf("%s: ConfigMap %s: %v", file, cm.Name, err)
			}
		case "lbd.yaml.tmpl":
			// Rendered on each node by the node-config init container.
			tmpl, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			rendered, err := nodeconfig.Render(string(tmpl), exampleNode)
			if err != nil {
				t.Errorf("%s: ConfigMap %s: %s: %v", file, cm.Name, key, err)
				continue
			}
			for in, local := range mounted {
				rendered = strings.ReplaceAll(rendered, in, local)
			}
			if err := os.WriteFile(path, []byte(rendered), 0o600); err != nil {
				t.Fatal(err)
			}
			c, err := lbdconfig.Load(path)
			if err == nil {
				err = c.Validate()
			}
			if err != nil {
				t.Errorf("%s: ConfigMap %s: %s rendered for node %s: %v", file, cm.Name, key, exampleNode.Name, err)
			}
		case "lbd.yaml":
			c, err := lbdconfig.Load(path)
			if err == nil {
				err = c.Validate()
			}
			if err != nil {
				t.Errorf("%s: ConfigMap %s: lbd.yaml: %v", file, cm.Name, err)
			}
		case "policy.yaml":
			// lbd's policy: loaded, and so checked, by lbd's configuration that names it.
			if !strings.Contains(cm.Data["lbd.yaml.tmpl"]+cm.Data["lbd.yaml"], templateMount+"/"+key) {
				t.Errorf("%s: ConfigMap %s: %s, which lbd's configuration does not name", file, cm.Name, key)
			}
		default:
			t.Errorf("%s: ConfigMap %s: unexpected key %q", file, cm.Name, key)
		}
	}
	return n
}

// templateMount is where the LB nodes' containers mount the lbd-lb ConfigMap.
const templateMount = "/etc/lbd-template"
