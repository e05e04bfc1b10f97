"""Argo CD health checks (deploy/argocd) run as Argo CD runs them, under a real Lua 5.1.

Argo CD (util/lua/lua.go) evaluates `<group>/<Kind>/health.lua` in gopher-lua, a Lua 5.1, with
the object as the global `obj` and takes the table the chunk returns as {status, message}; a
status outside its six is reported as Unknown. Scripts given in argocd-cm run without Lua's
standard libraries: only base, package, table and a reduced os (time, date). The runner below
gives the script exactly that much (no string, no math, no string methods), so a script that
passes here passes in both modes Argo CD runs it in.

Each `health_test.yaml` is argo-cd's own format (`tests: [{inputPath, healthStatus}]`) and is
judged as argo-cd's test judges it: status and message equal. Each test object is also read by
the API models, so the test data has the shape the operator writes, and statuses computed by
the operator's own status code are judged too, so the scripts follow what it writes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from inferfleet.api.common import API_GROUP
from inferfleet.api.inference_service import InferenceService
from inferfleet.api.model_deployment import ModelDeployment, Role
from inferfleet.planning.capacity import plan
from inferfleet.reconcile.status import Blocked, RoleProgress, model_deployment_status

ROOT = Path(__file__).resolve().parents[2]
CUSTOMIZATIONS = ROOT / "deploy" / "argocd"
CONFIGMAP_PATCH = CUSTOMIZATIONS / "argocd-cm-patch.yaml"
KINDS: dict[str, type[ModelDeployment] | type[InferenceService]] = {
    "ModelDeployment": ModelDeployment,
    "InferenceService": InferenceService,
}
LUA = "lua5.1"

# Argo CD's health statuses (gitops-engine pkg/health); anything else reads as Unknown.
HEALTH_STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}

RUNNER = r"""
local cjson = require("cjson")
local path = os.getenv("HEALTH_LUA")
local file = assert(io.open(path))
local source = file:read("*a")
file:close()
local chunk = assert(loadstring(source, "@" .. path))
local env = {}
for _, name in ipairs({"assert", "error", "getmetatable", "ipairs", "next", "pairs", "pcall",
    "print", "rawequal", "rawget", "rawset", "select", "setmetatable", "tonumber", "tostring",
    "type", "unpack", "xpcall", "_VERSION"}) do
  env[name] = _G[name]
end
env.table = {concat = table.concat, insert = table.insert, remove = table.remove,
  sort = table.sort, maxn = table.maxn, getn = table.getn}
env.os = {time = os.time, date = os.date}
env._G = env
env.obj = cjson.decode(io.read("*a"))
setfenv(chunk, env)
local string_meta = getmetatable("")
local string_methods = string_meta.__index
string_meta.__index = nil
local ok, result = pcall(chunk)
string_meta.__index = string_methods
if not ok then
  io.stderr:write(tostring(result))
  os.exit(2)
end
if type(result) ~= "table" then
  io.stderr:write("expect table output from Lua script, not " .. type(result))
  os.exit(3)
end
io.write(cjson.encode(result))
"""


class KubernetesYamlLoader(yaml.SafeLoader):
    """YAML as the API server's JSON holds it: timestamps stay strings."""


KubernetesYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_yaml(path: Path) -> Any:
    return yaml.load(path.read_text(), Loader=KubernetesYamlLoader)


def without_nulls(value: Any) -> Any:
    """A null field is an absent one in Argo CD's Lua table (lua.go decodeValue: nil -> LNil);
    lua-cjson would decode it as a truthy `cjson.null` instead."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        assert None not in value, "a null inside a list has no Lua equivalent"
        return [without_nulls(v) for v in value]
    return value


def health(script: Path, obj: dict[str, Any]) -> dict[str, str]:
    """{status, message} as Argo CD reports them for `obj`."""
    lua = shutil.which(LUA)
    assert lua, f"{LUA} is not installed (Debian: apt-get install lua5.1 lua-cjson)"
    run = subprocess.run(
        [lua, "-e", RUNNER],
        input=json.dumps(without_nulls(obj)),
        env={"HEALTH_LUA": str(script), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    assert run.returncode == 0, f"{script}: {run.stderr}"
    returned = json.loads(run.stdout)
    assert isinstance(returned, dict), f"{script} returned {returned!r}"
    if returned.get("status") not in HEALTH_STATUSES:
        return {"status": "Unknown", "message": "Lua returned an invalid health status"}
    return {"status": returned["status"], "message": returned.get("message", "")}


def script_of(kind: str) -> Path:
    return CUSTOMIZATIONS / API_GROUP / kind / "health.lua"


@dataclass(frozen=True)
class Case:
    kind: str
    input_path: Path
    expected: dict[str, str]

    @property
    def id(self) -> str:
        return f"{self.kind}/{self.input_path.name}"


def cases() -> list[Case]:
    found = []
    for kind in KINDS:
        directory = CUSTOMIZATIONS / API_GROUP / kind
        table = load_yaml(directory / "health_test.yaml")
        assert set(table) == {"tests"}
        for test in table["tests"]:
            assert set(test) == {"inputPath", "healthStatus"}, test
            assert set(test["healthStatus"]) <= {"status", "message"}, test
            found.append(Case(kind, directory / test["inputPath"], test["healthStatus"]))
    return found


CASES = cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_health_of_each_test_object(case: Case) -> None:
    obj = load_yaml(case.input_path)
    assert health(script_of(case.kind), obj) == {"message": "", **case.expected}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_test_object_is_one_the_api_accepts(case: Case) -> None:
    obj = load_yaml(case.input_path)
    assert (obj["apiVersion"].split("/")[0], obj["kind"]) == (API_GROUP, case.kind)
    conditions = obj.get("status", {}).get("conditions", [])
    ready = next((c for c in conditions if c["type"] == "Ready"), None)
    if ready and ready["reason"] == "InvalidSpec":
        with pytest.raises(ValidationError, match="cannot exceed the model's maxContextLength"):
            KINDS[case.kind].model_validate(obj)
    else:
        KINDS[case.kind].model_validate(obj)


@pytest.mark.parametrize("kind", KINDS)
def test_every_test_object_is_judged_and_every_verdict_is_covered(kind: str) -> None:
    judged = {c.input_path for c in CASES if c.kind == kind}
    on_disk = set((CUSTOMIZATIONS / API_GROUP / kind / "testdata").glob("*.yaml"))
    assert judged == on_disk
    statuses = {c.expected["status"] for c in CASES if c.kind == kind}
    assert {"Healthy", "Progressing", "Degraded"} <= statuses


# The operator's own status code, judged by the script: a renamed reason or condition there
# fails here.

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
EXAMPLES = ROOT / "examples"


def _example_deployment(file: str) -> dict[str, Any]:
    docs = list(yaml.safe_load_all((EXAMPLES / file).read_text()))
    found: dict[str, Any] = next(d for d in docs if d["kind"] == "ModelDeployment")
    found["metadata"] |= {"namespace": "llm", "generation": 4}
    return found


def _with_status(obj: dict[str, Any], **progress: Any) -> dict[str, Any]:
    md = ModelDeployment.model_validate(obj)
    capacity = plan(md.spec)
    blocked = (
        None
        if capacity.memory.fits
        else Blocked("SpecNotApplied", f"not applied: {capacity.memory.verdict()}")
    )
    roles = {Role.AGGREGATED: RoleProgress(**progress)} if progress else {}
    status = model_deployment_status(
        generation=4,
        plan=capacity,
        roles=roles,
        serving_role=Role.AGGREGATED,
        selector="app=x",
        previous={},
        now=NOW,
        blocked=blocked,
    )
    return {**obj, "status": status.to_wire()}


FITS = "llama-3.1-8b-aggregated-sim.yaml"
DOES_NOT_FIT = "llama-3.1-405b-bf16-l40s-does-not-fit.yaml"


def test_operator_status_rolled_out_is_healthy() -> None:
    obj = _with_status(_example_deployment(FITS), desired=2, updated=2, ready=2, available=2)
    assert health(script_of("ModelDeployment"), obj) == {
        "status": "Healthy",
        "message": "aggregated 2/2 ready",
    }


def test_operator_status_rolling_out_is_progressing() -> None:
    obj = _with_status(_example_deployment(FITS), desired=3, updated=1, ready=1, available=1)
    assert health(script_of("ModelDeployment"), obj) == {
        "status": "Progressing",
        "message": "aggregated 1/3 ready",
    }


def test_operator_status_past_the_progress_deadline_is_degraded() -> None:
    stalled = 'ReplicaSet "x" has timed out progressing.'
    obj = _with_status(
        _example_deployment(FITS), desired=3, updated=3, ready=1, available=1, stalled=stalled
    )
    assert health(script_of("ModelDeployment"), obj) == {
        "status": "Degraded",
        "message": f"aggregated: {stalled}",
    }


def test_operator_status_of_a_spec_that_does_not_fit_is_degraded_with_the_numbers() -> None:
    obj = _with_status(_example_deployment(DOES_NOT_FIT))
    md = ModelDeployment.model_validate(_example_deployment(DOES_NOT_FIT))
    verdict = plan(md.spec).memory.verdict()
    assert verdict.startswith("does not fit: weights")
    assert health(script_of("ModelDeployment"), obj) == {"status": "Degraded", "message": verdict}


# argocd-cm carries the same scripts; this file is what users apply or merge.


def test_configmap_patch_holds_the_scripts_verbatim() -> None:
    patch = load_yaml(CONFIGMAP_PATCH)
    assert (patch["apiVersion"], patch["kind"]) == ("v1", "ConfigMap")
    assert patch["metadata"]["name"] == "argocd-cm"
    assert patch["data"] == {
        f"resource.customizations.health.{API_GROUP}_{kind}": script_of(kind).read_text()
        for kind in KINDS
    }


def test_a_status_outside_argo_cds_six_reads_as_unknown(tmp_path: Path) -> None:
    """The runner reports what Argo CD would for a mistyped status, so such a script fails."""
    script = tmp_path / "health.lua"
    script.write_text('return {status = "Ready", message = "typo"}\n')
    assert health(script, {"metadata": {}})["status"] == "Unknown"


def test_the_runner_withholds_the_string_library(tmp_path: Path) -> None:
    """Scripts in argocd-cm run without it: a script using it must fail here too."""
    script = tmp_path / "health.lua"
    script.write_text('return {status = "Healthy", message = ("x"):upper()}\n')
    with pytest.raises(AssertionError, match="attempt to index"):
        health(script, {"metadata": {}})
