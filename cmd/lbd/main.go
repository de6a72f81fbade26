// Command lbd is the lbd load-balancer daemon.
package main

import (
	"os"

	"github.com/lbd-dev/lbd/daemon/lbd"
)

func main() {
	os.Exit(lbd.Main(os.Args[1:], os.Stdout, os.Stderr))
}
