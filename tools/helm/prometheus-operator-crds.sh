#!/usr/bin/env bash
# Prints the directory holding the Prometheus Operator's CustomResourceDefinitions
# (ServiceMonitor, PodMonitor, PrometheusRule...) at a pinned release, taken from its published
# Go module: the e2e tier installs them into the dev cluster so that the chart's monitoring
# objects are validated by the API server against the real schemas, as on a cluster with
# kube-prometheus-stack. The Go module cache (checksum-verified) is the cache.
set -euo pipefail

VERSION="v0.85.0"
MODULE="github.com/prometheus-operator/prometheus-operator"

export GOTOOLCHAIN=local GOFLAGS=-mod=mod
# Outside any module, so no go.mod of this checkout takes part.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
dir=$(go mod download -json "$MODULE@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
crds="$dir/example/prometheus-operator-crd"
[[ -f $crds/monitoring.coreos.com_servicemonitors.yaml ]] || {
    echo "prometheus-operator-crds.sh: no CRDs in $crds" >&2
    exit 1
}
echo "$crds"
