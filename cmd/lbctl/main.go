// Command lbctl controls an lbd load balancer; see package lbctl.
package main

import (
	"os"

	"github.com/lbd-dev/lbd/lbctl"
)

func main() {
	os.Exit(lbctl.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
