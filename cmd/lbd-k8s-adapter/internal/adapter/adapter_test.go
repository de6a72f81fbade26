package adapter

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/k8stest"
	"github.com/lbd-dev/lbd/daemon/apitest"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

func TestUsageErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	for _, tc := range []struct {
		args     []string
		code     int
		inStderr string
	}{
		{[]string{"--bogus"}, 2, "flag provided but not defined"},
		{[]string{"--log-level", "loud"}, 2, "--log-level"},
		{[]string{"--config", missing, "extra"}, 2, "unexpected arguments"},
		{[]string{"--config", missing}, 1, "read config"},
		{[]string{"node-config", "--template", missing}, 2, "need --template and --out"},
		{[]string{"node-config", "--template", missing, "--out", missing + ".out"}, 1, "read template"},
	} {
		var stderr bytes.Buffer
		if code := Run(context.Background(), tc.args, &stderr); code != tc.code || !strings.Contains(stderr.String(), tc.inStderr) {
			t.Errorf("Run(%q) = %d, stderr %q; want %d and %q", tc.args, code, stderr.String(), tc.code, tc.inStderr)
		}
	}
}

// TestRunFromFiles runs the command as deployed: a config file, a kubeconfig file, lbd on
// a Unix socket. A Service created in the cluster must reach lbd, and cancelling the
// context must stop the adapter cleanly.
func TestRunFromFiles(t *testing.T) {
	if why := k8stest.Missing(); why != "" {
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
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cluster.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	lbd := apitest.StartServer(t, store.DefaultLimits())
	cfg := filepath.Join(dir, "adapter.yaml")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	probes := ln.Addr().String()
	ln.Close()
	if err := os.WriteFile(cfg, fmt.Appendf(nil, `owner: files-test
lbdAddress: %s
sync: {minInterval: 50ms}
externalIPs: true
pools: [{name: ext, addresses: [203.0.113.0/24], autoAssign: false}]
leaderElection: {namespace: default}
healthListen: %s
`, lbd.Addr, probes), 0o600); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, []string{"--config", cfg, "--kubeconfig", kubeconfig, "--identity", "files-test"}, &stderr)
	}()

	kube, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{
			Ports:       []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
			ExternalIPs: []string{"203.0.113.5"},
		},
	}
	if _, err := kube.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(lbd.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := lbdv1.NewLoadBalancerServiceClient(conn)
	want := "default/web/http/tcp/203.0.113.5"
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := client.GetService(ctx, &lbdv1.GetServiceRequest{Name: want})
		if err == nil && resp.Service.Owner == "files-test" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lbd never got %s (last error %v); adapter log:\n%s", want, err, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get("http://" + probes + path)
		if err != nil {
			t.Fatalf("probe %s: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %d %s", path, resp.StatusCode, body)
		}
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit code %d; log:\n%s", code, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("adapter did not stop")
	}
}

// TestNodeConfig renders a template as the DaemonSet's init container does, from the
// downward API's environment variables.
func TestNodeConfig(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "lbd.yaml.tmpl"), filepath.Join(dir, "lbd.yaml")
	if err := os.WriteFile(in, []byte("bgp: {router_id: ${NODE_IPV4}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NODE_NAME", "edge-1")
	t.Setenv("NODE_IPS", "198.18.0.11,2001:db8:f::11")
	var stderr bytes.Buffer
	if code := Run(context.Background(), []string{"node-config", "--template", in, "--out", out}, &stderr); code != 0 {
		t.Fatalf("node-config: exit %d: %s", code, stderr.String())
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "bgp: {router_id: 198.18.0.11}\n" {
		t.Errorf("rendered %q, %v", b, err)
	}
	t.Setenv("NODE_IPS", "2001:db8:f::11")
	stderr.Reset()
	if code := Run(context.Background(), []string{"node-config", "--template", in, "--out", out}, &stderr); code != 1 || !strings.Contains(stderr.String(), "${NODE_IPV4} has no value") {
		t.Errorf("node-config without an IPv4 address: exit %d, %q", code, stderr.String())
	}
}
