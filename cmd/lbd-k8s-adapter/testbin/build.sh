#!/bin/sh
# Builds kube-apiserver and etcd for the adapter's integration tests from the
# Go module proxy (pinned in this wrapper module's go.mod), into a cache
# directory that the tests find on their own. Reuses binaries already there.
#
#   cmd/lbd-k8s-adapter/testbin/build.sh [DIR]
#
# DIR defaults to $KUBEBUILDER_ASSETS, else $HOME/.cache/lbd/k8s-testbin/<version>.
# The version below must match the default in the integration tests
# (cmd/lbd-k8s-adapter/internal/k8stest).
set -eu

version=v1.36.3
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-${KUBEBUILDER_ASSETS:-$HOME/.cache/lbd/k8s-testbin/$version}}

if [ -x "$dir/kube-apiserver" ] && [ -x "$dir/etcd" ]; then
	echo "k8s test binaries already in $dir"
	exit 0
fi

mkdir -p "$dir"
cd "$here"
# Build into temporary names and rename, so an interrupted build never leaves
# a truncated binary that the reuse check above would accept.
# The version stamp is what "kube-apiserver --version" and /version report.
go build -trimpath -o "$dir/kube-apiserver.tmp" \
	-ldflags "-X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36" \
	k8s.io/kubernetes/cmd/kube-apiserver
go build -trimpath -o "$dir/etcd.tmp" go.etcd.io/etcd/server/v3
mv "$dir/kube-apiserver.tmp" "$dir/kube-apiserver"
mv "$dir/etcd.tmp" "$dir/etcd"
echo "k8s test binaries built in $dir"
