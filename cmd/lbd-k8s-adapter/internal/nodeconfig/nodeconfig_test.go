package nodeconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRender(t *testing.T) {
	n, err := FromEnv(func(k string) string {
		return map[string]string{"NODE_NAME": "edge-1", "NODE_IPS": "198.18.0.11,2001:db8:f::11"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := Render("router_id: ${NODE_IPV4}\nnext_hop_v6: ${NODE_IPV6}\n# ${NODE_NAME} costs $$5\n", n)
	if want := "router_id: 198.18.0.11\nnext_hop_v6: 2001:db8:f::11\n# edge-1 costs $5\n"; err != nil || got != want {
		t.Errorf("Render = %q, %v; want %q", got, err, want)
	}
	for tmpl, wantErr := range map[string]string{
		"a: ${NODE_IPV6}":    "${NODE_IPV6} has no value",
		"a: ${HOSTNAME}":     "${HOSTNAME} is not a variable",
		"a: $NODE_IP, ${X}":  "${NODE_IP} is not a variable",
		"a: ${NODE_IPV6} $Y": "${Y} is not a variable",
	} {
		_, err := Render(tmpl, Node{Name: "n", IPs: n.IPs[:1]})
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("Render(%q) = %v, want an error containing %q", tmpl, err, wantErr)
		}
	}
	if _, err := FromEnv(func(k string) string { return map[string]string{"NODE_IPS": "x"}[k] }); err == nil {
		t.Error("FromEnv accepted NODE_IPS=x")
	}
}

func TestRenderFile(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "lbd.yaml.tmpl"), filepath.Join(dir, "lbd.yaml")
	if err := os.WriteFile(in, []byte("name: ${NODE_NAME}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := RenderFile(in, out, Node{Name: "edge-2"}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "name: edge-2\n" {
		t.Errorf("rendered %q, %v", b, err)
	}
	if err := RenderFile(in, filepath.Join(dir, "missing", "x"), Node{Name: "e"}); err == nil {
		t.Error("RenderFile into a missing directory succeeded")
	}
}
