#!/usr/bin/env bash
# Copies the operator, router and sim-engine images to a registry:
#   push.sh REGISTRY [skopeo copy options...]
# e.g. `push.sh registry.example.com/inferfleet` pushes registry.example.com/inferfleet/router:<version>
# and the other two. Options go to `skopeo copy` as they are (--dest-creds USER:PASS,
# --dest-tls-verify=false, --dest-authfile FILE ...). The images come from
# $INFERFLEET_IMAGES_DIR, or from tools/images/build.sh (built once, then cached).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ $# -lt 1 || $1 == -* ]]; then
    echo "usage: push.sh REGISTRY [skopeo copy options...]" >&2
    exit 2
fi
registry=${1%/}
shift
images_dir=${INFERFLEET_IMAGES_DIR:-$(bash "$here/build.sh" | tail -n 1)}

for name in operator router sim-engine; do
    # The layout's one tag, as build.sh wrote it (the package version).
    tag=$(python3 -c 'import json, sys
index = json.load(open(sys.argv[1]))
(manifest,) = index["manifests"]
print(manifest["annotations"]["org.opencontainers.image.ref.name"])' "$images_dir/$name/index.json")
    echo "push.sh: $name:$tag -> $registry/$name:$tag" >&2
    skopeo copy "$@" "oci:$images_dir/$name:$tag" "docker://$registry/$name:$tag"
    echo "$registry/$name:$tag"
done
