#!/usr/bin/env bash
# Runs the images of tools/images/build.sh as a kubelet would, through crun: unpacked from
# their OCI layouts, as uid 65532, read-only root, every capability dropped, /tmp a tmpfs, the
# image's own entrypoint, env and PATH. Checks that
#   * the image config carries the package version, the OCI labels and a non-root user;
#   * no shell is in the image;
#   * `inferfleet --version` (operator) prints the package version, `inferfleet router --help`
#     and `inferfleet sim-engine --help` run, the operator's entrypoint with no cluster says so;
#   * the sim-engine image serves on 127.0.0.1 (the host's network) and answers /v1/models.
# Usage: smoke.sh [IMAGES_DIR] (default: build, or take from the cache, with build.sh).
# Needs root (umoci unpack, unshare, crun).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}
[[ -x $python ]] || python=$(command -v python3)
images_dir=${1:-$(bash "$here/build.sh" | tail -n 1)}
# The package's one version, inferfleet.__version__ (pyproject reads it from there too).
version=$("$python" -c 'import ast, sys
tree = ast.parse(open(sys.argv[1]).read())
print(next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
           and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["__version__"]))' \
    "$repo/operator/inferfleet/__init__.py")
uid=65532

fail() { echo "smoke.sh: FAIL: $*" >&2; exit 1; }
ok() { echo "smoke.sh: ok: $*" >&2; }

work=$(mktemp -d)
state="$work/crun"
server=""
cleanup() {
    if [[ -n $server ]]; then
        crun --root "$state" kill "$server" KILL 2>/dev/null || true
        crun --root "$state" delete --force "$server" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# 1. Image configs: labels, version, user, entrypoint.
for name in operator router sim-engine; do
    skopeo inspect --config "oci:$images_dir/$name:$version" >"$work/$name.json"
    "$python" - "$work/$name.json" "$name" "$version" <<'PY' || fail "$name: image config"
import json
import sys

path, name, version = sys.argv[1:]
config = json.load(open(path))["config"]
labels = config["Labels"]
prefix = "org.opencontainers.image."
for key in ("title", "version", "source", "licenses", "revision", "created"):
    assert prefix + key in labels, f"label {prefix + key} missing"
assert labels[prefix + "version"] == version, labels[prefix + "version"]
assert labels[prefix + "licenses"] == "Apache-2.0"
assert labels[prefix + "title"] == f"inferfleet-{name}"
user = config["User"].split(":")[0]
assert user not in ("", "0", "root"), f"user {config['User']!r}"
command = {"operator": "run", "router": "router", "sim-engine": "sim-engine"}[name]
assert config["Entrypoint"] == ["/opt/inferfleet/bin/inferfleet", command], config["Entrypoint"]
assert any(e.startswith("PATH=/opt/inferfleet/bin:") for e in config["Env"]), config["Env"]
PY
done
ok "labels (version $version), non-root user and entrypoint of operator, router, sim-engine"

# 2. One root filesystem: the three images share their only layer, so one unpack serves all.
layers() { skopeo inspect --raw "oci:$images_dir/$1:$version" | "$python" -c 'import json, sys
print(" ".join(layer["digest"] for layer in json.load(sys.stdin)["layers"]))'; }
[[ $(layers operator) == "$(layers sim-engine)" && $(layers router) == "$(layers sim-engine)" ]] ||
    fail "the images do not share their layer"
umoci unpack --image "$images_dir/sim-engine:$version" "$work/bundle" >/dev/null
rootfs="$work/bundle/rootfs"
for shell in sh bash dash; do
    for dir in bin usr/bin sbin usr/sbin; do
        [[ ! -e $rootfs/$dir/$shell ]] || fail "a shell in the image: /$dir/$shell"
    done
done
ok "one shared layer; no shell in it"

# The bundle's config.json for IMAGE with ARGS (empty: the image's entrypoint): as a
# kubelet's, but in the host's network namespace and without cgroups (none to enforce here).
bundle_config() {
    "$python" - "$work/bundle/config.json" "$work/$1.json" "$uid" "${@:2}" <<'PY'
import json
import sys

path, image_config_path, uid, *args = sys.argv[1:]
config = json.load(open(path))
image = json.load(open(image_config_path))["config"]
process = config["process"]
process["args"] = args or image["Entrypoint"] + image.get("Cmd", [])
process["env"] = image["Env"]
process["user"] = {"uid": int(uid), "gid": int(uid)}
process["terminal"] = False
process["noNewPrivileges"] = True
process["capabilities"] = {key: [] for key in ("bounding", "effective", "permitted")}
config["root"]["readonly"] = True
linux = config["linux"]
linux["namespaces"] = [ns for ns in linux["namespaces"] if ns["type"] != "network"]
linux.pop("resources", None)
config["mounts"] = [m for m in config["mounts"] if m["destination"] != "/sys/fs/cgroup"]
config["mounts"].append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                         "options": ["nosuid", "nodev", "mode=1777", "size=64m"]})
json.dump(config, open(path, "w"))
PY
}

# crun in a private mount namespace: on a host whose cgroup v2 hierarchy holds controllers
# beside v1 ones (hybrid), crun refuses to start anything, so that hierarchy is hidden from it.
crun_run() {
    unshare --mount --propagation private -- bash -c '
        if mountpoint -q /sys/fs/cgroup/unified; then umount /sys/fs/cgroup/unified; fi
        exec crun --root "$1" --cgroup-manager=disabled run --bundle "$2" "$3"' \
        crun "$state" "$work/bundle" "$1"
}

# 3. Commands, each in its image's configuration.
bundle_config operator inferfleet --version
out=$(crun_run "smoke-$$-version") || fail "inferfleet --version: $out"
[[ $out == *"$version"* ]] || fail "inferfleet --version printed $out"
ok "inferfleet --version: $out"

bundle_config router inferfleet router --help
out=$(crun_run "smoke-$$-router") || fail "inferfleet router --help: $out"
[[ $out == *"--backend"* ]] || fail "inferfleet router --help printed $out"
ok "inferfleet router --help"

bundle_config sim-engine inferfleet sim-engine --help
out=$(crun_run "smoke-$$-sim-help") || fail "inferfleet sim-engine --help: $out"
[[ $out == *"--gpu"* ]] || fail "inferfleet sim-engine --help printed $out"
ok "inferfleet sim-engine --help"

# The operator's own entrypoint (`inferfleet run`) with no cluster to talk to: one line, exit 1.
bundle_config operator
if out=$(crun_run "smoke-$$-operator" 2>&1); then fail "inferfleet run without a cluster exited 0"; fi
[[ $out == error:* && $(wc -l <<<"$out") -eq 1 ]] || fail "inferfleet run printed: $out"
ok "inferfleet run (entrypoint) without a cluster: $out"

# 4. The sim-engine image's entrypoint serving on 127.0.0.1.
port=$("$python" -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
bundle_config sim-engine
"$python" - "$work/bundle/config.json" "$port" <<'PY'
import json
import sys

path, port = sys.argv[1:]
config = json.load(open(path))
config["process"]["args"] += ["--model", "llama-3.1-8b", "--model-name", "smoke",
                              "--gpu", "H100-80GB", "--host", "127.0.0.1", "--port", port]
json.dump(config, open(path, "w"))
PY
server="smoke-$$-serve"
crun_run "$server" >"$work/serve.log" 2>&1 &
"$python" - "$port" <<'PY' || { cat "$work/serve.log" >&2; fail "sim-engine did not serve /v1/models"; }
import json
import sys
import time
import urllib.request

url = f"http://127.0.0.1:{sys.argv[1]}/v1/models"
deadline = time.monotonic() + 60
while True:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            models = json.load(response)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.5)
ids = [model["id"] for model in models["data"]]
assert ids == ["smoke"], ids
PY
ok "sim-engine image serves /v1/models on 127.0.0.1:$port"
crun --root "$state" kill "$server" TERM
wait
server=""
echo "smoke.sh: all passed ($images_dir)" >&2
