#!/usr/bin/env bash
# Builds the helm client once from its published Go module at the version pinned in go.mod and
# caches it outside the work tree. The last line of stdout is the bin directory (holding
# `helm`). A second run with the cache present only prints it.
set -euo pipefail

start=$SECONDS
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0

# The version comes from go.mod so there is a single place to pin it.
modver() { awk -v m="$2" '$1 == m { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$1"; }
helm_version=$(modver "$here/go.mod" helm.sh/helm/v4)
[[ -n $helm_version ]] || { echo "build.sh: cannot read the helm version from go.mod" >&2; exit 1; }

# Any change to the sources, this script or the Go toolchain gives a new key.
sources=(go.mod go.sum build.sh)
hash=$( (cd "$here" && cat "${sources[@]}"; go version) | sha256sum | cut -c1-12)
key="helm-${helm_version}_${hash}"

root="${INFERFLEET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/inferfleet}/helm"
dest="$root/$key"

done_msg() {
    echo "build.sh: $1 in $((SECONDS - start))s" >&2
    echo "$dest/bin"
}

# The complete marker is written last, inside the directory that is renamed
# into place, so its presence means a whole build.
if [[ -f $dest/bin/.complete ]]; then
    done_msg "cached"
    exit 0
fi

mkdir -p "$root"
# Serialise concurrent builds of the same cache; the loser finds it done.
if command -v flock >/dev/null; then
    exec 9>"$root/.lock"
    flock 9
    if [[ -f $dest/bin/.complete ]]; then
        done_msg "cached"
        exit 0
    fi
    # Holding the lock, any leftover build directory is from a killed run.
    rm -rf "$root"/.build.*
fi

tmp=$(mktemp -d "$root/.build.XXXXXX")
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT
bin="$tmp/bin"
mkdir -p "$bin"

# Same version stamp as helm's own release build (its Makefile's LDFLAGS), so `helm version`
# and the charts' .Capabilities.HelmVersion report the release.
ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$helm_version"
ldflags+=" -X helm.sh/helm/v4/internal/version.gitTreeState=clean"

echo "build.sh: building $key" >&2
(cd "$here" && go build -trimpath -ldflags "$ldflags" -o "$bin/helm" helm.sh/helm/v4/cmd/helm)
"$bin/helm" version --short >&2

touch "$bin/.complete"
# rename(2) is atomic; if the directory appeared meanwhile keep that one.
if ! mv -T "$tmp" "$dest" 2>/dev/null && [[ ! -f $dest/bin/.complete ]]; then
    echo "build.sh: cannot move the build into $dest" >&2
    exit 1
fi
done_msg "built"
