#!/usr/bin/env bash
# Prints the path of promtool (rule checks and rule unit tests), fetched once from Debian's
# `prometheus` package at the version fetch.sh pins and cached outside the work tree:
#   ~/.cache/inferfleet/promtool/<version>/promtool
# The package is unpacked, not installed. $INFERFLEET_PROMTOOL, when set, names a binary to
# use instead.
set -euo pipefail

VERSION="$(sed -n 's/^VERSION="\(.*\)"$/\1/p' "$(dirname "$0")/fetch.sh")"

if [[ -n "${INFERFLEET_PROMTOOL:-}" ]]; then
  echo "$INFERFLEET_PROMTOOL"
  exit 0
fi

ROOT="${INFERFLEET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/inferfleet}/promtool"
CACHE="$ROOT/$VERSION"
if [[ -f "$CACHE/.complete" ]]; then
  echo "$CACHE/promtool"
  exit 0
fi

mkdir -p "$ROOT"
exec 9>"$ROOT/.lock"
flock 9
if [[ -f "$CACHE/.complete" ]]; then  # fetched while we waited
  echo "$CACHE/promtool"
  exit 0
fi

WORK="$(mktemp -d "$ROOT/.fetch.XXXXXX")"
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
cp root/usr/bin/promtool out/promtool
"$WORK/out/promtool" --version >&2
touch out/.complete
rm -rf "$CACHE"
mv out "$CACHE"
echo "$CACHE/promtool"
