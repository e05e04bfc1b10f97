#!/usr/bin/env bash
# Builds the local control plane binaries (kube multi-call, etcd, kwok) once
# and caches them by version outside the work tree. The last line of stdout
# is the bin directory. A second run with the cache present only prints it.
set -euo pipefail

start=$SECONDS
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0

# Versions come from the go.mod files so there is a single place to pin them.
modver() { awk -v m="$2" '$1 == m { print $2; exit }' "$1"; }
kube_version=$(modver "$here/go.mod" k8s.io/kubernetes)
etcd_version=$(modver "$here/etcd/go.mod" go.etcd.io/etcd/server/v3)
kwok_version=$(modver "$here/kwok/go.mod" sigs.k8s.io/kwok)
for v in kube_version etcd_version kwok_version; do
    [[ -n ${!v} ]] || { echo "build.sh: cannot read $v from go.mod" >&2; exit 1; }
done

# Any change to the sources, this script or the Go toolchain gives a new key.
sources=(go.mod go.sum main.go etcd/go.mod etcd/go.sum kwok/go.mod kwok/go.sum build.sh)
hash=$( (cd "$here" && cat "${sources[@]}"; go version) | sha256sum | cut -c1-12)
key="kube-${kube_version}_etcd-${etcd_version}_kwok-${kwok_version}_${hash}"

root="${INFERFLEET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/inferfleet}/devcluster"
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

# Same version stamps as the upstream release build (hack/lib/version.sh),
# so /version, kubectl version and emulation-version checks see a release.
minor=${kube_version#v1.}
minor=${minor%%.*}
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    kube_ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1"
    kube_ldflags+=" -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.gitCommit="
done

echo "build.sh: building $key" >&2
(cd "$here" && go build -trimpath -ldflags "$kube_ldflags" -o "$bin/kube" .)
(cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3)
(cd "$here/kwok" && go build -trimpath -ldflags "-s -w" -o "$bin/kwok" sigs.k8s.io/kwok/cmd/kwok)

for name in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    ln -s kube "$bin/$name"
done

# kwok needs Stage objects to act on nodes and pods; take kwok's own default
# ones ("fast" node/pod stages, node heartbeat via Lease) from the pinned module.
kwok_dir=$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
{
    for f in node/fast/node-initialize.yaml \
        node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
        pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
        echo "---"
        cat "$kwok_dir/kustomize/stage/$f"
    done
} >"$bin/kwok-stages.yaml"

touch "$bin/.complete"
# rename(2) is atomic; if the directory appeared meanwhile keep that one.
if ! mv -T "$tmp" "$dest" 2>/dev/null && [[ ! -f $dest/bin/.complete ]]; then
    echo "build.sh: cannot move the build into $dest" >&2
    exit 1
fi
done_msg "built"
