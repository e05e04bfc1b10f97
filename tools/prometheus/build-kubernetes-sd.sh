#!/usr/bin/env bash
# Prints the path of a Prometheus server binary with Kubernetes service discovery, built once
# from the published Go module at a pinned version and cached outside the work tree:
#   ~/.cache/inferfleet/prometheus/kubernetes-sd-<version>/prometheus
# Debian's package (fetch.sh) is built without the Kubernetes discovery; this build has it and
# nothing else of the optional ones (Prometheus' `remove_all_sd` and `enable_kubernetes_sd`
# build tags; file and HTTP discovery are always in). The web UI's assets are left out: the
# API and /metrics are what the local fleet uses.
# $INFERFLEET_PROMETHEUS_KUBERNETES_SD, when set, names a binary to use instead.
set -euo pipefail

VERSION="v0.309.1"  # Prometheus 3.9.1's Go module version

if [[ -n "${INFERFLEET_PROMETHEUS_KUBERNETES_SD:-}" ]]; then
  echo "$INFERFLEET_PROMETHEUS_KUBERNETES_SD"
  exit 0
fi

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/inferfleet/prometheus/kubernetes-sd-$VERSION"
if [[ -x "$CACHE/prometheus" ]]; then
  echo "$CACHE/prometheus"
  exit 0
fi

mkdir -p "$(dirname "$CACHE")"
exec 9>"$(dirname "$CACHE")/.lock-kubernetes-sd"
flock 9
if [[ -x "$CACHE/prometheus" ]]; then  # built while we waited
  echo "$CACHE/prometheus"
  exit 0
fi

start=$SECONDS
WORK="$(mktemp -d "$(dirname "$CACHE")/.build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/out"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=readonly"
# Built as the main module (its go.mod has exclude directives, which `go install pkg@v` refuses).
source_dir=$(go mod download -json "github.com/prometheus/prometheus@$VERSION" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
cp -r "$source_dir" "$WORK/src"
chmod -R u+w "$WORK/src"
(cd "$WORK/src" && go build -trimpath -tags remove_all_sd,enable_kubernetes_sd \
  -o "$WORK/out/prometheus" ./cmd/prometheus) >&2
"$WORK/out/prometheus" --version >&2
mv "$WORK/out" "$CACHE"
echo "build-kubernetes-sd.sh: built in $((SECONDS - start))s" >&2
echo "$CACHE/prometheus"
