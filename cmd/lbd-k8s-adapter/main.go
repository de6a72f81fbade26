// Command lbd-k8s-adapter keeps an lbd's services equal to a Kubernetes cluster's
// LoadBalancer Services and external IPs, and allocates their VIPs from pools.
package main

import (
	"os"

	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/adapter"
)

func main() {
	os.Exit(adapter.Main(os.Args[1:], os.Stderr))
}
