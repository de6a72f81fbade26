// Package k8stest starts a real kube-apiserver and etcd for the adapter's integration
// tests, and finds kubectl, from binaries built by cmd/lbd-k8s-adapter/testbin/build.sh.
// It never downloads: without the binaries, tests skip and name the command that builds
// them.
package k8stest

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// Version is the Kubernetes version the tests run against; build.sh builds it.
const Version = "v1.36.3"

// BuildCommand builds the binaries into the default directory.
const BuildCommand = "cmd/lbd-k8s-adapter/testbin/build.sh"

// AssetsDir is where the binaries are looked for: $KUBEBUILDER_ASSETS, else
// $HOME/.cache/lbd/k8s-testbin/<Version>.
func AssetsDir() string {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".cache", "lbd", "k8s-testbin", Version)
}

// Missing returns why the binaries cannot be used, or "" when they are there.
func Missing() string {
	return missing("kube-apiserver", "etcd")
}

// MissingKubectl returns why Kubectl cannot be used, or "" when it is there. Missing does
// not look for it, so the tests that need no kubectl still run with a cache built before
// build.sh built kubectl.
func MissingKubectl() string {
	return missing("kubectl")
}

// Kubectl is the path of the kubectl that build.sh builds next to the apiserver, at the
// same version, so that its client-side checks and the server agree.
func Kubectl() string {
	return filepath.Join(AssetsDir(), "kubectl")
}

func missing(bins ...string) string {
	dir := AssetsDir()
	for _, bin := range bins {
		if st, err := os.Stat(filepath.Join(dir, bin)); err != nil || st.Mode()&0o111 == 0 {
			return fmt.Sprintf("no %s in %q: build the test binaries with %s (or set KUBEBUILDER_ASSETS)", bin, dir, BuildCommand)
		}
	}
	return ""
}

// ServiceCIDRs are the test apiserver's cluster IP ranges, IPv4 first.
const ServiceCIDRs = "10.0.0.0/16,fd00:10:96::/108"

// Cluster is a running apiserver and etcd.
type Cluster struct {
	Config *rest.Config
	env    *envtest.Environment
}

// Start starts kube-apiserver and etcd from AssetsDir. The caller must Stop it.
func Start() (*Cluster, error) {
	if why := Missing(); why != "" {
		return nil, fmt.Errorf("start test cluster: %s", why)
	}
	// envtest logs through controller-runtime, which complains with a stack trace
	// unless a logger is set; its start-up chatter is not wanted.
	ctrllog.SetLogger(logr.Discard())
	env := &envtest.Environment{BinaryAssetsDirectory: AssetsDir()}
	api := env.ControlPlane.GetAPIServer()
	// No controllers run, so the apiserver must not expect any: no endpoint reconciler,
	// and Service ranges that do not run out (a /24 does after ~250 Services), of both
	// families so that dual-stack Services can be created.
	api.Configure().
		Set("advertise-address", "127.0.0.1").
		Set("endpoint-reconciler-type", "none").
		Set("service-cluster-ip-range", ServiceCIDRs)
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("start test cluster: %w", err)
	}
	return &Cluster{Config: cfg, env: env}, nil
}

// WriteKubeconfig writes a kubeconfig file for the cluster's admin user, for code that
// loads its client configuration from a file as a deployment would.
func (c *Cluster) WriteKubeconfig(path string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: c.Config.Host, CertificateAuthorityData: c.Config.CAData}
	kc.AuthInfos["test"] = &clientcmdapi.AuthInfo{ClientCertificateData: c.Config.CertData, ClientKeyData: c.Config.KeyData, Token: c.Config.BearerToken}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	kc.CurrentContext = "test"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

// Stop stops the apiserver and etcd and removes their data.
func (c *Cluster) Stop() error {
	if err := c.env.Stop(); err != nil {
		return fmt.Errorf("stop test cluster: %w", err)
	}
	return nil
}
