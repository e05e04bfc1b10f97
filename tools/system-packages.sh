#!/usr/bin/env bash
# Installs the Debian packages the tests and the local fleet run, when any is missing (apt-get;
# a Debian or Ubuntu machine, as root or with sudo). Quiet and quick when all are there.
#   lua5.1, lua-cjson       Argo CD's health checks run under Lua 5.1 (Argo CD's gopher-lua
#                           is a Lua 5.1), objects handed over as JSON
#   crun, umoci             the dev cluster's OCI runtime mode: images unpacked, then run
#   mmdebstrap, buildah,    tools/images/build.sh: a Debian root filesystem, the images built
#   skopeo                  from runtime_images/ and copied between layouts and registries
#   openssh-server,         a multi-node TensorRT-LLM group's launch: the leader's ssh into a
#   openssh-client,         worker's daemon, and Open MPI's mpirun over the group, run on
#   openmpi-bin             loopback by tests/unit/test_multinode_launch.py
set -euo pipefail

packages=(lua5.1 lua-cjson crun umoci mmdebstrap buildah skopeo openssh-server openssh-client
    openmpi-bin)

missing=()
for package in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
    [[ $status == "install ok installed" ]] || missing+=("$package")
done
((${#missing[@]})) || exit 0

sudo=()
((EUID == 0)) || sudo=(sudo)
echo "system-packages.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 || {
    "${sudo[@]}" apt-get update -qq >&2
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}
