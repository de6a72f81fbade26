#!/bin/sh
# Builds kube-apiserver, etcd and kubectl for the adapter's integration tests from
# the Go module proxy (pinned in this wrapper module's go.mod), into a cache
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

if [ -x "$dir/kube-apiserver" ] && [ -x "$dir/etcd" ] && [ -x "$dir/kubectl" ]; then
	echo "k8s test binaries already in $dir"
	exit 0
fi

mkdir -p "$dir"
cd "$here"
# The version stamp is what "kube-apiserver --version", /version and
# "kubectl version" report.
stamp="-X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36"
# Build into temporary names and rename, so an interrupted build never leaves
# a truncated binary that the reuse check above would accept. Only what is
# missing is built: a cache from before kubectl was added gets just kubectl.
if [ ! -x "$dir/kube-apiserver" ]; then
	go build -trimpath -o "$dir/kube-apiserver.tmp" -ldflags "$stamp" k8s.io/kubernetes/cmd/kube-apiserver
	mv "$dir/kube-apiserver.tmp" "$dir/kube-apiserver"
fi
if [ ! -x "$dir/etcd" ]; then
	go build -trimpath -o "$dir/etcd.tmp" go.etcd.io/etcd/server/v3
	mv "$dir/etcd.tmp" "$dir/etcd"
fi
if [ ! -x "$dir/kubectl" ]; then
	go build -trimpath -o "$dir/kubectl.tmp" -ldflags "$stamp" k8s.io/kubernetes/cmd/kubectl
	mv "$dir/kubectl.tmp" "$dir/kubectl"
fi
echo "k8s test binaries built in $dir"
