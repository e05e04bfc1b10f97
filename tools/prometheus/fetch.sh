#!/usr/bin/env bash
# Prints the path of a Prometheus server binary, fetched once from Debian's `prometheus`
# package at a pinned version and cached outside the work tree, with the package's promtool
# (rule checks and rule unit tests) beside it:
#   ~/.cache/inferfleet/prometheus/<version>/prometheus
#   ~/.cache/inferfleet/prometheus/<version>/promtool
# The package is unpacked, not installed: no service is started, nothing lands in /usr.
# Needs apt-get (a Debian or Ubuntu machine with Debian's archive in its sources) and dpkg-deb.
# $INFERFLEET_PROMETHEUS, when set, names a binary to use instead.
set -euo pipefail

VERSION="2.42.0+ds-5+deb12u1"

if [[ -n "${INFERFLEET_PROMETHEUS:-}" ]]; then
  echo "$INFERFLEET_PROMETHEUS"
  exit 0
fi

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/inferfleet/prometheus/$VERSION"
if [[ -x "$CACHE/prometheus" && -x "$CACHE/promtool" ]]; then
  echo "$CACHE/prometheus"
  exit 0
fi

mkdir -p "$(dirname "$CACHE")"
exec 9>"$(dirname "$CACHE")/.lock"
flock 9
if [[ -x "$CACHE/prometheus" && -x "$CACHE/promtool" ]]; then  # fetched while we waited
  echo "$CACHE/prometheus"
  exit 0
fi

WORK="$(mktemp -d "$(dirname "$CACHE")/.fetch.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
if ! apt-get download "prometheus=$VERSION" >&2 2>/dev/null; then
  # A fresh machine may have no package lists yet.
  if [[ "$(id -u)" == 0 ]]; then
    apt-get update -qq >&2
  fi
  apt-get download "prometheus=$VERSION" >&2
fi
dpkg-deb -x prometheus_*.deb root
mkdir -p out
cp root/usr/bin/prometheus root/usr/bin/promtool out/
"$WORK/out/prometheus" --version >&2
"$WORK/out/promtool" --version >&2
rm -rf "$CACHE"  # an older cache held the server alone
mv out "$CACHE"
echo "$CACHE/prometheus"
