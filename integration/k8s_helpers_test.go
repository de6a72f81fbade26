//go:build linux

package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	"github.com/lbd-dev/lbd/internal/testnet"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// k8sVersion is the Kubernetes release whose kube-apiserver and etcd the test runs; `make
// k8s-testbin` (cmd/lbd-k8s-adapter/testbin/build.sh) builds them into k8sAssetsDir.
const k8sVersion = "v1.36.3"

// k8sAssetsDir is where kube-apiserver and etcd are looked for: $KUBEBUILDER_ASSETS, else
// the cache of build.sh. The adapter's own tests use the same directory.
func k8sAssetsDir() string {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".cache", "lbd", "k8s-testbin", k8sVersion)
}

// adapterBin returns the path of lbd-k8s-adapter next to the lbd binary the testbed
// runs, skipping the test when it is not there (only `make build` builds it; the
// testbed's own fallback build makes lbd and lbctl alone).
func adapterBin(t testing.TB, lbdBin string) string {
	t.Helper()
	bin := filepath.Join(filepath.Dir(lbdBin), "lbd-k8s-adapter")
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no %s: run `make build` and set LBD_BIN_DIR to its bin directory: %v", bin, err)
	}
	return bin
}

// kubeCluster is a real kube-apiserver and etcd started by the test, in the host's
// network namespace: the adapters run there too.
type kubeCluster struct {
	config     *rest.Config
	client     kubernetes.Interface
	kubeconfig string // admin kubeconfig file for the adapters
}

// startKube starts kube-apiserver and etcd with envtest, which never downloads anything
// when given the binaries' directory. Without the binaries the test skips. They are
// stopped (by envtest, by PID) and their data removed when the test ends.
func startKube(t testing.TB, dir string) *kubeCluster {
	t.Helper()
	assets := k8sAssetsDir()
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if st, err := os.Stat(filepath.Join(assets, bin)); err != nil || st.Mode()&0o111 == 0 {
			t.Skipf("no %s in %q: build the binaries with `make k8s-testbin` (or set KUBEBUILDER_ASSETS)", bin, assets)
		}
	}
	// envtest logs through controller-runtime, which complains with a stack trace
	// unless a logger is set; its start-up chatter is not wanted.
	ctrllog.SetLogger(logr.Discard())
	env := &envtest.Environment{BinaryAssetsDirectory: assets}
	// No controllers run: the apiserver must not expect an endpoint reconciler, and
	// needs Service ranges of its own (docs/testing.md), of both families for IPv6 Services.
	env.ControlPlane.GetAPIServer().Configure().
		Set("advertise-address", "127.0.0.1").
		Set("endpoint-reconciler-type", "none").
		Set("service-cluster-ip-range", "10.0.0.0/16,fd00:10:96::/108")
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start kube-apiserver and etcd: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop kube-apiserver and etcd: %v", err)
		}
	})
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("create kubernetes client: %v", err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["test"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	kc.CurrentContext = "test"
	path := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatalf("write kubeconfig: %v", err)
	}
	return &kubeCluster{config: cfg, client: client, kubeconfig: path}
}

// createNamespace creates a namespace. No namespace controller runs, so nothing in it is
// ever garbage-collected: the apiserver's data goes away with the test.
func (k *kubeCluster) createNamespace(t testing.TB, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := k.client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
}

// createNode registers a backend node as a Kubernetes Node with its IPv4 InternalIP, which
// the adapter uses as the outer destination of the node's endpoints.
func (k *kubeCluster) createNode(t *testing.T, n *node) {
	t.Helper()
	obj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}
	created, err := k.client.CoreV1().Nodes().Create(context.Background(), obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node %s: %v", n.name, err)
	}
	// Addresses are status: the create above drops them, a status update sets them.
	created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.addr4.String()}}
	if _, err := k.client.CoreV1().Nodes().UpdateStatus(context.Background(), created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("set addresses of node %s: %v", n.name, err)
	}
}

// adapterConfig is the configuration file of one LB node's adapter: every adapter has the
// same owner, pools and Lease; only the lbd socket differs. Syncs and the Lease are fast
// so that the test does not wait for production timings.
func adapterConfig(t *testing.T, path, owner, lbdSock, leaseNS, pool string) {
	t.Helper()
	cfg := fmt.Sprintf(`owner: %s
lbdAddress: unix://%s
sync: {minInterval: 100ms, maxInterval: 1m}
pools:
  - name: e2e
    addresses: [%s]
leaderElection:
  namespace: %s
  leaseDuration: 3s
  renewDeadline: 2s
  retryPeriod: 200ms
`, owner, lbdSock, pool, leaseNS)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
}

// startAdapter runs lbd-k8s-adapter for one LB node in the host's network namespace,
// where it reaches the apiserver on the loopback and lbd through its socket file. Its log
// goes to <dir>/adapter-<node>.log and is shown if the test fails; it is killed by PID
// when the test ends.
func (tb *testbed) startAdapter(t *testing.T, bin string, lb *node, kubeconfig, cfgPath string) *testnet.Proc {
	t.Helper()
	return tb.spawn("adapter-"+lb.name, nil, nil, bin, "--config", cfgPath, "--kubeconfig", kubeconfig, "--identity", lb.name)
}
