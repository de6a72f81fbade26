package examplestest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// chartDir is the Helm chart, relative to the repository root.
var chartDir = filepath.Join("deploy", "helm", "lbd")

// helmTool is helm as `make release-tools` builds it (the Makefile exports HELM), else
// the one on PATH.
func helmTool(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("HELM"); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, err := exec.LookPath("helm")
	if err != nil {
		t.Skip("needs helm: make release-tools builds it")
	}
	return p
}

// k8sObject is one rendered or example Kubernetes object, as generic YAML.
type k8sObject map[string]any

func (o k8sObject) kindName() string {
	md, _ := o["metadata"].(map[string]any)
	return fmt.Sprintf("%v/%v", o["kind"], md["name"])
}

func parseObjects(t *testing.T, what string, b []byte) map[string]k8sObject {
	t.Helper()
	out := map[string]k8sObject{}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		var o k8sObject
		if err := yaml.Unmarshal(doc, &o); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if o == nil {
			continue
		}
		out[o.kindName()] = o
	}
}

// get walks a path of map keys and list indexes (ints) through generic YAML.
func get(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			l, _ := v.([]any)
			if k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

// containers returns a DaemonSet's containers by name.
func containers(ds k8sObject) map[string]map[string]any {
	return podContainers(ds, "containers")
}

// podContainers returns the containers of a DaemonSet's pod list field ("containers",
// "initContainers") by name.
func podContainers(ds k8sObject, field string) map[string]map[string]any {
	out := map[string]map[string]any{}
	l, _ := get(map[string]any(ds), "spec", "template", "spec", field).([]any)
	for _, c := range l {
		m, _ := c.(map[string]any)
		out[fmt.Sprint(m["name"])] = m
	}
	return out
}

// renderChart runs helm lint and helm template with the chart's defaults.
func renderChart(t *testing.T) map[string]k8sObject {
	t.Helper()
	helm := helmTool(t)
	if out, err := exec.Command(helm, "lint", "--strict", path(chartDir)).CombinedOutput(); err != nil {
		t.Fatalf("helm lint --strict: %v\n%s", err, out)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(helm, "template", "lbd", path(chartDir), "--namespace", "lbd-system")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.String())
	}
	return parseObjects(t, "helm template", stdout.Bytes())
}

// TestHelmChart lints and renders the chart and checks what it deploys: both
// DaemonSets probe lbd's /readyz and /healthz where the rendered configuration puts its
// metrics listener, the adapter's probes go to its healthListen, and lbd and the adapter
// accept the rendered configurations (the LB nodes' lbd.yaml as the node-config init
// container renders it for a node).
func TestHelmChart(t *testing.T) {
	objs := renderChart(t)
	for _, ds := range []string{"lbd-lb", "lbd-backend"} {
		t.Run(ds, func(t *testing.T) {
			d, ok := objs["DaemonSet/"+ds]
			if !ok {
				t.Fatalf("the chart renders no DaemonSet %s", ds)
			}
			cm, ok := objs["ConfigMap/"+ds]
			if !ok {
				t.Fatalf("the chart renders no ConfigMap %s", ds)
			}
			if name := get(map[string]any(d), "spec", "template", "spec", "volumes", 0, "configMap", "name"); name != ds {
				t.Errorf("the config volume mounts ConfigMap %v, want %s", name, ds)
			}
			lbdYAML, _ := get(map[string]any(cm), "data", "lbd.yaml").(string)
			if tmpl, ok := get(map[string]any(cm), "data", "lbd.yaml.tmpl").(string); ok {
				lbdYAML = renderNodeConfig(t, tmpl)
			}
			var cfg struct {
				MetricsListen string   `json:"metrics_listen"`
				Roles         []string `json:"roles"`
			}
			if err := yaml.Unmarshal([]byte(lbdYAML), &cfg); err != nil {
				t.Fatalf("lbd.yaml of %s: %v", ds, err)
			}
			host, port, err := net.SplitHostPort(cfg.MetricsListen)
			if err != nil {
				t.Fatalf("lbd.yaml of %s: metrics_listen %q: %v", ds, cfg.MetricsListen, err)
			}
			c := containers(d)["lbd"]
			if c == nil {
				t.Fatal("no lbd container")
			}
			for probe, path := range map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz"} {
				g := get(c, probe, "httpGet")
				want := map[string]any{"host": host, "path": path, "port": mustAtoi(t, port)}
				if !reflect.DeepEqual(normalize(g), normalize(want)) {
					t.Errorf("%s: %v, want an HTTP GET of %v", probe, g, want)
				}
			}
			// The rendered configuration, as the container reads it, with lbd's own parser;
			// the files it names in the ConfigMap's mount (the policy) are the ConfigMap's.
			dir := t.TempDir()
			if strings.Contains(lbdYAML, configMapMount) && !mounts(c, "template", configMapMount) {
				t.Errorf("lbd.yaml names files in %s, and the lbd container does not mount the ConfigMap there", configMapMount)
			}
			for k, v := range get(map[string]any(cm), "data").(map[string]any) {
				f := filepath.Join(dir, k)
				if err := os.WriteFile(f, []byte(fmt.Sprint(v)), 0o600); err != nil {
					t.Fatal(err)
				}
				lbdYAML = strings.ReplaceAll(lbdYAML, configMapMount+"/"+k, f)
			}
			file := filepath.Join(dir, "lbd.yaml")
			if err := os.WriteFile(file, []byte(lbdYAML), 0o600); err != nil {
				t.Fatal(err)
			}
			runExecStart(t, "lbd", []string{"--config", file}, "")
			if adapterYAML, ok := get(map[string]any(cm), "data", "k8s-adapter.yaml").(string); ok {
				afile := filepath.Join(t.TempDir(), "k8s-adapter.yaml")
				if err := os.WriteFile(afile, []byte(adapterYAML), 0o600); err != nil {
					t.Fatal(err)
				}
				runExecStart(t, "lbd-k8s-adapter", []string{"--config", afile, "--kubeconfig", filepath.Join(t.TempDir(), "absent")}, "")
				checkAdapterProbes(t, containers(d)["k8s-adapter"], adapterYAML)
			} else if ds == "lbd-lb" {
				t.Error("ConfigMap lbd-lb has no k8s-adapter.yaml")
			}
		})
	}
}

// configMapMount is where the LB nodes' containers mount the lbd-lb ConfigMap.
const configMapMount = "/etc/lbd-template"

// mounts reports whether container c mounts volume at dir.
func mounts(c map[string]any, volume, dir string) bool {
	l, _ := c["volumeMounts"].([]any)
	for _, m := range l {
		if mm, _ := m.(map[string]any); mm["name"] == volume && mm["mountPath"] == dir {
			return true
		}
	}
	return false
}

// renderNodeConfig renders an lbd configuration template the way the node-config init
// container does, for a node with an address of each family.
func renderNodeConfig(t *testing.T, tmpl string) string {
	t.Helper()
	dir := t.TempDir()
	in, out := filepath.Join(dir, "lbd.yaml.tmpl"), filepath.Join(dir, "lbd.yaml")
	if err := os.WriteFile(in, []byte(tmpl), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, "lbd-k8s-adapter"), "node-config", "--template", in, "--out", out)
	cmd.Env = append(os.Environ(), "NODE_NAME=edge-1", "NODE_IPS=198.18.0.11,2001:db8:f::11")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("lbd-k8s-adapter node-config: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "router_id: 198.18.0.11") {
		t.Errorf("the rendered lbd.yaml has no router_id of the node:\n%s", b)
	}
	return string(b)
}

// checkAdapterProbes checks that the adapter container probes /readyz and /healthz
// where its configuration's healthListen listens.
func checkAdapterProbes(t *testing.T, c map[string]any, adapterYAML string) {
	t.Helper()
	var cfg struct {
		HealthListen string `json:"healthListen"`
	}
	if err := yaml.Unmarshal([]byte(adapterYAML), &cfg); err != nil {
		t.Fatalf("k8s-adapter.yaml: %v", err)
	}
	host, port, err := net.SplitHostPort(cfg.HealthListen)
	if err != nil {
		t.Fatalf("k8s-adapter.yaml: healthListen %q: %v", cfg.HealthListen, err)
	}
	for probe, path := range map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz"} {
		g := get(c, probe, "httpGet")
		want := map[string]any{"host": host, "path": path, "port": mustAtoi(t, port)}
		if !reflect.DeepEqual(normalize(g), normalize(want)) {
			t.Errorf("k8s-adapter %s: %v, want an HTTP GET of %v", probe, g, want)
		}
	}
}

// TestHelmChartMatchesExamples renders the chart with its defaults and compares it
// with examples/k8s, which the guides apply by hand: the same objects, RBAC rules,
// containers (commands, security contexts, mounts, environment, and probes and
// resources wherever the examples set them), volumes and scheduling, and
// configurations that hold every setting of the examples' with the same value.
func TestHelmChartMatchesExamples(t *testing.T) {
	chart := renderChart(t)
	files, err := filepath.Glob(path("examples", "k8s", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("examples/k8s: %v, %v", files, err)
	}
	examples := map[string]k8sObject{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for k, o := range parseObjects(t, f, b) {
			examples[k] = o
		}
	}
	for key, ex := range examples {
		if ex["kind"] == "Namespace" {
			continue // helm install --create-namespace makes it
		}
		ch, ok := chart[key]
		if !ok {
			t.Errorf("examples/k8s has %s, the chart does not render it", key)
			continue
		}
		switch ex["kind"] {
		case "ClusterRole", "Role":
			if !reflect.DeepEqual(ex["rules"], ch["rules"]) {
				t.Errorf("%s: rules differ:\nexamples: %v\nchart:    %v", key, ex["rules"], ch["rules"])
			}
		case "ClusterRoleBinding", "RoleBinding":
			for _, f := range []string{"roleRef", "subjects"} {
				if !reflect.DeepEqual(ex[f], ch[f]) {
					t.Errorf("%s: %s differ: %v, chart %v", key, f, ex[f], ch[f])
				}
			}
		case "ConfigMap":
			exData, _ := ex["data"].(map[string]any)
			chData, _ := ch["data"].(map[string]any)
			for k, v := range exData {
				var exCfg, chCfg any
				if err := yaml.Unmarshal([]byte(fmt.Sprint(v)), &exCfg); err != nil {
					t.Fatalf("%s %s: %v", key, k, err)
				}
				if err := yaml.Unmarshal([]byte(fmt.Sprint(chData[k])), &chCfg); err != nil {
					t.Fatalf("chart %s %s: %v", key, k, err)
				}
				for _, d := range missingFrom(exCfg, chCfg, k) {
					t.Errorf("%s: %s", key, d)
				}
			}
		case "DaemonSet":
			compareDaemonSets(t, key, ex, ch)
		}
	}
}

// compareDaemonSets compares what a DaemonSet of the examples sets with the chart's.
func compareDaemonSets(t *testing.T, key string, ex, ch k8sObject) {
	t.Helper()
	pod := func(o k8sObject, f string) any { return get(map[string]any(o), "spec", "template", "spec", f) }
	for _, f := range []string{"hostNetwork", "dnsPolicy", "nodeSelector", "affinity", "serviceAccountName", "volumes"} {
		if !reflect.DeepEqual(pod(ex, f), pod(ch, f)) {
			t.Errorf("%s: spec.template.spec.%s differ:\nexamples: %v\nchart:    %v", key, f, pod(ex, f), pod(ch, f))
		}
	}
	if !reflect.DeepEqual(get(map[string]any(ex), "spec", "selector"), get(map[string]any(ch), "spec", "selector")) {
		t.Errorf("%s: selectors differ", key)
	}
	for _, list := range []string{"initContainers", "containers"} {
		exC, chC := podContainers(ex, list), podContainers(ch, list)
		if len(exC) != len(chC) {
			t.Errorf("%s: %s %v in the examples, %v in the chart", key, list, keys(exC), keys(chC))
		}
		for name, e := range exC {
			c, ok := chC[name]
			if !ok {
				t.Errorf("%s: the chart has no %s entry %s", key, list, name)
				continue
			}
			for f, v := range e {
				if f == "image" {
					continue // the chart's comes from its values
				}
				if !reflect.DeepEqual(normalize(v), normalize(c[f])) {
					t.Errorf("%s container %s: %s differs:\nexamples: %v\nchart:    %v", key, name, f, v, c[f])
				}
			}
		}
	}
}

// missingFrom lists the settings of ex (generic YAML) that got lacks or holds with
// another value; got may hold more.
func missingFrom(ex, got any, at string) []string {
	switch e := ex.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return []string{fmt.Sprintf("%s: %v, the examples have a map", at, got)}
		}
		var out []string
		for k, v := range e {
			out = append(out, missingFrom(v, g[k], at+"."+k)...)
		}
		return out
	default:
		if !reflect.DeepEqual(normalize(ex), normalize(got)) {
			return []string{fmt.Sprintf("%s: %v in the examples, %v in the chart", at, ex, got)}
		}
		return nil
	}
}

// normalize makes generic YAML comparable: numbers as float64 whatever their source.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			out[k] = normalize(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = normalize(e)
		}
		return out
	case int:
		return float64(x)
	case int64:
		return float64(x)
	}
	return v
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatalf("port %q: %v", s, err)
	}
	return n
}
