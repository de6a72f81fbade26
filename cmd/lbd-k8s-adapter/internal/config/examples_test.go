package config

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"testing"

	lbdconfig "github.com/lbd-dev/lbd/daemon/config"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
)

const examplesDir = "../../../../examples/k8s"

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
		}
	}
	if adapterConfigs != 1 {
		t.Errorf("found %d adapter configs in the ConfigMaps, want 1", adapterConfigs)
	}
}

func checkConfigMap(t *testing.T, file string, obj runtime.Object) int {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return 0
	}
	n := 0
	for key, val := range cm.Data {
		path := filepath.Join(t.TempDir(), key)
		if err := os.WriteFile(path, []byte(val), 0o600); err != nil {
			t.Fatal(err)
		}
		switch key {
		case "k8s-adapter.yaml":
			n++
			if _, err := Load(path); err != nil {
				t.Errorf("%s: ConfigMap %s: %v", file, cm.Name, err)
			}
		case "lbd.yaml":
			c, err := lbdconfig.Load(path)
			if err == nil {
				err = c.Validate()
			}
			if err != nil {
				t.Errorf("%s: ConfigMap %s: lbd.yaml: %v", file, cm.Name, err)
			}
		default:
			t.Errorf("%s: ConfigMap %s: unexpected key %q", file, cm.Name, key)
		}
	}
	return n
}
