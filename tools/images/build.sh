#!/usr/bin/env bash
# Builds the operator, router and sim-engine images from runtime_images/ with no base image
# from a registry, once, and caches them outside the work tree:
#   ~/.cache/inferfleet/images/<version>_<hash>/{operator,router,sim-engine}
# each an OCI image layout holding the tag <version> (`skopeo copy oci:DIR/router:0.1.0 ...`).
# The last line of stdout is that directory; build times and sizes go to stderr.
#
# The root filesystem is Debian bookworm's python3.11 and the libraries it links, unpacked by
# mmdebstrap (variant extract: no maintainer script runs), stripped of the package manager
# and documentation; the wheels of runtime_images/requirements.lock (hashes checked) and the
# inferfleet wheel of this checkout go into the virtual environment /opt/inferfleet; bytecode
# is precompiled by the image's own interpreter. buildah then builds each Containerfile
# (FROM scratch, ADD of that tree: no RUN step) with its storage in the build directory.
#
# Needs root (mmdebstrap's root mode, chroot, buildah), Debian's archive and PyPI; installs
# mmdebstrap, buildah, umoci and skopeo with apt-get when missing. $PYTHON picks the Python
# (3.11, with pip) that downloads wheels and builds inferfleet's: the project's .venv by default.
set -euo pipefail

start=$SECONDS
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
images_dir="$repo/runtime_images"
lock="$images_dir/requirements.lock"
images=(operator router sim-engine)

SUITE=bookworm
MIRROR=http://deb.debian.org/debian
SECURITY_MIRROR=http://deb.debian.org/debian-security
# Wheels for the image's interpreter: Debian bookworm's CPython 3.11 on glibc 2.36. pip takes
# the platforms it may install literally, so every manylinux tag glibc 2.36 runs is named.
PLATFORM=manylinux_2_36_x86_64
platform_args=(--only-binary=:all: --python-version 3.11 --implementation cp --abi cp311)
for glibc_minor in $(seq 36 -1 17); do
    platform_args+=(--platform "manylinux_2_${glibc_minor}_x86_64")
done
platform_args+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64)
platform_args+=(--platform manylinux1_x86_64)
# What python3.11 pulls in that only dpkg and tar need: dropped from the image.
PACKAGES_DROPPED=(dpkg tar libacl1 libselinux1 libpcre2-8-0 libmd0 libzstd1)

python=${PYTHON:-$repo/.venv/bin/python}
[[ -x $python ]] || python=$(command -v python3)

# The package's one version, inferfleet.__version__ (pyproject reads it from there too).
version=$("$python" -c 'import ast, sys
tree = ast.parse(open(sys.argv[1]).read())
print(next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
           and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["__version__"]))' \
    "$repo/operator/inferfleet/__init__.py")
[[ -n $version ]] || { echo "build.sh: cannot read inferfleet.__version__" >&2; exit 1; }

# The files the inferfleet wheel is built from: all of them are in the key.
package_files() {
    (cd "$repo" && { echo pyproject.toml; echo README.md; ls LICENSE* 2>/dev/null || true
        find operator/inferfleet -type f ! -name '*.pyc' ! -path '*/__pycache__/*'; } | LC_ALL=C sort)
}

# Any change to the images' files, the lock, the package's sources, this script or the suite
# gives a new key.
hash=$( (cd "$repo" && {
    find runtime_images -type f | LC_ALL=C sort | xargs sha256sum
    sha256sum tools/images/build.sh
    package_files | xargs sha256sum
    echo "$SUITE $PLATFORM"
}) | sha256sum | cut -c1-12)
key="${version}_${hash}"

root="${INFERFLEET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/inferfleet}/images"
dest="$root/$key"

done_msg() {
    echo "build.sh: $1 in $((SECONDS - start))s" >&2
    if [[ -f $dest/sizes.txt ]]; then sed 's/^/build.sh: /' "$dest/sizes.txt" >&2; fi
    echo "$dest"
}

# The complete marker is written last, inside the directory that is renamed into place, so
# its presence means a whole build.
if [[ -f $dest/.complete ]]; then
    done_msg "cached"
    exit 0
fi

missing=()
for tool in mmdebstrap buildah umoci skopeo; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
    echo "build.sh: installing ${missing[*]}" >&2
    apt-get install -y -qq "${missing[@]}" >&2 || { apt-get update -qq >&2 &&
        apt-get install -y -qq "${missing[@]}" >&2; }
fi

mkdir -p "$root"
# Serialise concurrent builds of the same cache; the loser finds it done.
exec 9>"$root/.lock"
flock 9
if [[ -f $dest/.complete ]]; then
    done_msg "cached"
    exit 0
fi
# Holding the lock, any leftover build directory is from a killed run.
rm -rf "$root"/.build.*

tmp=$(mktemp -d "$root/.build.XXXXXX")
chmod 755 "$tmp"
buildah_() {
    buildah --storage-driver vfs --root "$tmp/storage" --runroot "$tmp/run" "$@"
}
cleanup() {
    # buildah's vfs storage may hold read-only directories; make them removable first.
    chmod -R u+w "$tmp" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

build_time=$(date -u +%s)
created=$(date -u -d "@$build_time" +%Y-%m-%dT%H:%M:%SZ)
revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
if [[ $revision != unknown ]] &&
    [[ -n $(git -C "$repo" status --porcelain -- operator/inferfleet pyproject.toml runtime_images) ]]; then
    revision="$revision-dirty"
fi
source_url=$("$python" -c 'import sys, tomllib
urls = tomllib.load(open(sys.argv[1], "rb"))["project"].get("urls", {})
print(urls.get("Source", urls.get("Repository", "")))' "$repo/pyproject.toml")
[[ -n $source_url ]] || source_url=$(git -C "$repo" remote get-url origin 2>/dev/null || true)

echo "build.sh: building images $key" >&2

# 1. Wheels: inferfleet's, built from a copy of its sources (the work tree stays clean), and
#    the locked ones for the image's platform, checked against the lock's hashes.
mkdir -p "$tmp/src" "$tmp/wheels"
package_files | tar --create --directory "$repo" --files-from - | tar --extract --directory "$tmp/src"
"$python" -m pip wheel --quiet --no-deps --wheel-dir "$tmp/wheels" "$tmp/src" >&2
"$python" -m pip download --quiet --require-hashes --requirement "$lock" --dest "$tmp/wheels" \
    "${platform_args[@]}" >&2

# 2. Debian's python3.11 and the libraries it needs, unpacked.
rootfs="$tmp/rootfs"
mmdebstrap --quiet --mode=root --variant=extract --skip=cleanup/apt/cache \
    --include=python3.11-minimal,libpython3.11-stdlib \
    "$SUITE" "$rootfs" "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" \
    "deb $SECURITY_MIRROR $SUITE-security main" >&2

# Each kept package's control record goes to /var/lib/dpkg/status.d/ (the layout image
# scanners read in images without dpkg); the dropped packages' files are removed.
mkdir -p "$rootfs/var/lib/dpkg/status.d"
for deb in "$rootfs"/var/cache/apt/archives/*.deb; do
    package=$(dpkg-deb --field "$deb" Package)
    if [[ " ${PACKAGES_DROPPED[*]} " == *" $package "* ]]; then
        dpkg-deb --fsys-tarfile "$deb" | tar -t | while read -r path; do
            target="$rootfs/${path#./}"
            if [[ -f $target || -L $target ]]; then rm -f "$target"; fi
        done
    else
        dpkg-deb --field "$deb" >"$rootfs/var/lib/dpkg/status.d/$package"
        echo "Status: install ok installed" >>"$rootfs/var/lib/dpkg/status.d/$package"
    fi
done
# Keep each package's copyright file, drop the rest of the documentation and what only a
# package manager or an interactive user reads.
find "$rootfs/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete
rm -rf "$rootfs"/var/cache/apt "$rootfs"/var/lib/apt "$rootfs"/etc/apt "$rootfs"/var/log/* \
    "$rootfs"/var/lib/dpkg/{status,available,arch,info,triggers,alternatives,updates,parts} \
    "$rootfs"/usr/share/{man,info,locale,lintian,bug,menu} \
    "$rootfs"/usr/lib/python3.11/{idlelib,turtledemo,tkinter,ensurepip,lib2to3}
find "$rootfs" -xdev -type d -empty -path '*/usr/share/*' -delete
for shell in bin/sh bin/bash bin/dash usr/bin/sh usr/bin/bash usr/bin/dash; do
    [[ ! -e $rootfs/$shell ]] || { echo "build.sh: a shell is in the image: /$shell" >&2; exit 1; }
done
cp -a "$images_dir/base/etc/." "$rootfs/etc/"
chmod 1777 "$rootfs/tmp"

# 3. The virtual environment /opt/inferfleet on Debian's interpreter, laid out as `python3.11
#    -m venv --without-pip` would, filled by the host's pip for the image's platform from the
#    wheels above only (a requirement missing from the lock fails here).
venv="$rootfs/opt/inferfleet"
site="$venv/lib/python3.11/site-packages"
mkdir -p "$venv/bin" "$site"
ln -s /usr/bin/python3.11 "$venv/bin/python3.11"
ln -s python3.11 "$venv/bin/python3"
ln -s python3.11 "$venv/bin/python"
ln -s lib "$venv/lib64"
printf 'home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11\n' >"$venv/pyvenv.cfg"
"$python" -m pip install --quiet --no-index --find-links "$tmp/wheels" --target "$site" \
    "${platform_args[@]}" "inferfleet==$version" >&2
# pip --target puts console scripts under the target with the host's interpreter in their
# first line; they belong in the venv's bin with its own.
for script in "$site"/bin/*; do
    sed '1s|^#!.*|#!/opt/inferfleet/bin/python3.11|' "$script" >"$venv/bin/$(basename "$script")"
    chmod 755 "$venv/bin/$(basename "$script")"
done
rm -rf "$site/bin"
[[ -x $venv/bin/inferfleet ]] || { echo "build.sh: no inferfleet entry point" >&2; exit 1; }

# 4. Bytecode, by the image's interpreter, as unchecked-hash .pyc: valid without the sources'
#    timestamps and never rewritten, so a read-only root costs no start-up time.
chroot "$rootfs" /usr/bin/python3.11 -m compileall -q -j 1 --invalidation-mode unchecked-hash \
    /usr/lib/python3.11 /opt/inferfleet/lib/python3.11/site-packages >/dev/null
chroot "$rootfs" /opt/inferfleet/bin/python3.11 -c "import inferfleet, sys
assert inferfleet.__version__ == sys.argv[1], inferfleet.__version__" "$version"

# 5. One layer for the three images: a tar with fixed owners, order and times.
mkdir -p "$tmp/context"
tar --create --file "$tmp/context/inferfleet-rootfs.tar" --directory "$rootfs" --sort=name \
    --numeric-owner --owner=0 --group=0 --mtime="@$build_time" --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime .
rootfs_bytes=$(du -sb "$rootfs" | cut -f1)

# 6. The images, each pushed to its own OCI layout; blobs they share are hard-linked.
out="$tmp/out"
mkdir -p "$out"
for name in "${images[@]}"; do
    buildah_ bud --quiet --isolation chroot --timestamp "$build_time" \
        --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
        --build-arg "CREATED=$created" --build-arg "SOURCE=$source_url" \
        --file "$images_dir/$name/Containerfile" --tag "localhost/inferfleet/$name:$version" \
        "$tmp/context" >&2
    buildah_ push --quiet "localhost/inferfleet/$name:$version" "oci:$out/$name:$version" >&2
done
for name in "${images[@]:1}"; do
    for blob in "$out/$name"/blobs/sha256/*; do
        first="$out/${images[0]}/blobs/sha256/$(basename "$blob")"
        [[ ! -f $first ]] || ln -f "$first" "$blob"
    done
done

# Sizes: what a registry stores (compressed layers + config + manifest) and the unpacked root.
for name in "${images[@]}"; do
    manifest=$(skopeo inspect --raw "oci:$out/$name:$version")
    bytes=$(echo "$manifest" | "$python" -c 'import json, sys
m = json.load(sys.stdin)
print(sum(d["size"] for d in [m["config"], *m["layers"]]))')
    printf '%s:%s %d MiB compressed, %d MiB unpacked\n' "$name" "$version" \
        $((bytes / 1048576)) $((rootfs_bytes / 1048576)) >>"$out/sizes.txt"
done
touch "$out/.complete"
# rename(2) is atomic; if the directory appeared meanwhile keep that one.
if ! mv -T "$out" "$dest" 2>/dev/null && [[ ! -f $dest/.complete ]]; then
    echo "build.sh: cannot move the build into $dest" >&2
    exit 1
fi
cleanup
trap - EXIT
done_msg "built"
