#!/bin/sh
# Builds the etcd server and etcdctl that the fleet store's tests run, from the Go
# module proxy at the version this wrapper module's go.mod pins (v3.6.8: the version
# of go.etcd.io/etcd/client/v3 that lbd links, so the tests exercise the client against
# its own server release; Debian bookworm's etcd-server is 3.4), into a cache directory
# that internal/etcdtest finds on its own. Reuses binaries already there.
#
#   internal/etcdtest/testbin/build.sh [DIR]
#
# DIR defaults to $LBD_ETCD_DIR, else $HOME/.cache/lbd/etcd/<version>. The version
# below must match etcdtest.Version.
set -eu

version=v3.6.8
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-${LBD_ETCD_DIR:-$HOME/.cache/lbd/etcd/$version}}

if [ -x "$dir/etcd" ] && [ -x "$dir/etcdctl" ]; then
	echo "etcd test binaries already in $dir"
	exit 0
fi

mkdir -p "$dir"
cd "$here"
# Temporary names, renamed once complete: an interrupted build never leaves a
# truncated binary that the reuse check above would accept.
if [ ! -x "$dir/etcd" ]; then
	go build -trimpath -o "$dir/etcd.tmp" go.etcd.io/etcd/server/v3
	mv "$dir/etcd.tmp" "$dir/etcd"
fi
if [ ! -x "$dir/etcdctl" ]; then
	go build -trimpath -o "$dir/etcdctl.tmp" go.etcd.io/etcd/etcdctl/v3
	mv "$dir/etcdctl.tmp" "$dir/etcdctl"
fi
echo "etcd test binaries built in $dir"
