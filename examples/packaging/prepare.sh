#!/bin/sh
# Prepares what the packages install besides the binaries (.goreleaser.yaml runs it):
# the systemd units of examples/systemd with the binaries in /usr/bin, and the manual
# pages generated from lbd's flags and lbctl's commands (docs/mangen), compressed.
#
#   examples/packaging/prepare.sh OUTDIR VERSION
set -eu
out=$1
version=$2
rm -rf "$out"
mkdir -p "$out/systemd" "$out/man"
for unit in examples/systemd/*.service; do
	sed 's|/usr/local/bin/|/usr/bin/|g' "$unit" >"$out/systemd/${unit##*/}"
done
go run ./docs/mangen -out "$out/man" -version "$version"
gzip -9n "$out"/man/*
