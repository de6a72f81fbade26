//go:build tools

// Package testbin pins the etcd server and etcdctl that the fleet store's tests run
// (build.sh builds them from this module's go.mod).
package testbin

import (
	_ "go.etcd.io/etcd/etcdctl/v3"
	_ "go.etcd.io/etcd/server/v3"
)
