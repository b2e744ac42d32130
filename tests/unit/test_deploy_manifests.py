"""deploy/: every manifest parses, names real CLI verbs and conf files, and keeps the security
defaults (token auth, 127.0.0.1 bindings, secrets from Secrets, non-root image).

No Kubernetes, Docker or Slurm here: the KubeRay manifests are checked against a compact JSON
Schema of the ray.io/v1 fields they rely on (no ray.io CRD schema ships in a PyPI package we use).
"""

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from orchestrator.cli import VERBS

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
YAMLS = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))
SBATCH = DEPLOY / "slurm" / "sweep.sbatch"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
CONFIG_VERBS = {"plan", "train", "sweep", "submit", "prepare"}  # their first argument is a conf file
COMMAND_KEYS = {"entrypoint", "command", "args", "setup_commands", "head_setup_commands", "worker_setup_commands",
                "initialization_commands", "head_start_ray_commands", "worker_start_ray_commands"}


def docs(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def kind(name):
    return [(p, d) for p in YAMLS for d in docs(p) if isinstance(d, dict) and d.get("kind") == name]


# ---------------------------------------------------------------- parsing and commands

@pytest.mark.parametrize("path", YAMLS, ids=[str(p.relative_to(DEPLOY)) for p in YAMLS])
def test_manifest_parses(path):
    assert docs(path), f"{path} holds no YAML document"


def test_every_target_has_files_and_a_readme():
    assert (DEPLOY / "README.md").is_file()
    for target in ("kuberay", "vm", "docker", "mlflow", "slurm"):
        folder = DEPLOY / target
        readme = folder / "README.md"
        assert readme.is_file(), f"{folder} has no README.md"
        for f in folder.iterdir():
            if f.name != "README.md" and not f.name.startswith("."):
                assert f.name in readme.read_text(), f"{readme} does not mention {f.name}"


def _yaml_commands(node, key=None):
    """Shell command strings under the keys that hold commands, anywhere in a document."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _yaml_commands(v, k)
    elif isinstance(node, list):
        if key in ("command", "args") and all(isinstance(x, str) for x in node):
            yield shlex.join(node) if key == "args" or len(node) < 3 or node[1] != "-c" else node[-1]
        else:
            for item in node:
                yield from _yaml_commands(item, key)
    elif isinstance(node, str) and key in COMMAND_KEYS:
        yield node


def _dockerfile_instructions(path):
    """[(INSTRUCTION, argument)] with continuation lines joined and comments dropped."""
    out, buf = [], ""
    for line in path.read_text().splitlines():
        if line.strip().startswith("#") and not buf:
            continue
        buf += line.rstrip("\\").rstrip() + " " if line.rstrip().endswith("\\") else line
        if not line.rstrip().endswith("\\"):
            if buf.strip():
                instr, _, arg = buf.strip().partition(" ")
                out.append((instr.upper(), arg.strip()))
            buf = ""
    return out


def _shell_lines(path):
    text = re.sub(r"<<'EOF'\n.*?\nEOF\n", "\n", path.read_text(), flags=re.S)  # heredoc bodies are Python
    return [line for line in text.replace("\\\n", " ").splitlines() if line.strip() and not line.lstrip().startswith("#")]


def all_commands():
    """(source, shell command) for every command the deploy files run."""
    cmds = [(str(p.relative_to(ROOT)), c) for p in YAMLS for d in docs(p) for c in _yaml_commands(d)]
    cmds += [(str(SBATCH.relative_to(ROOT)), line) for line in _shell_lines(SBATCH)]
    cmds += [(str(DOCKERFILE.relative_to(ROOT)), arg) for instr, arg in _dockerfile_instructions(DOCKERFILE)
             if instr in ("RUN", "CMD", "ENTRYPOINT")]
    return cmds


def _resolve_var(token, source):
    """`"$SWEEP"` in the sbatch script -> the default of its assignment `SWEEP="${1:-conf/...}"`."""
    match = re.fullmatch(r"\$\{?(\w+)\}?", token)
    if not match:
        return token
    text = (ROOT / source).read_text()
    assign = re.search(rf"^{match.group(1)}=\"?\$\{{\w+:-([^}}]+)\}}\"?", text, re.M) or \
        re.search(rf"^{match.group(1)}=\"?([^\"\s]+)", text, re.M)
    return assign.group(1) if assign else token


def orchestrator_calls():
    """(source, verb, first positional argument) for each `orchestrator VERB ...` / `python -m orchestrator`."""
    calls = []
    for source, cmd in all_commands():
        lexer = shlex.shlex(cmd, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        tokens = list(lexer)
        for i, tok in enumerate(tokens):
            at_start = i == 0 or tokens[i - 1] in (";", "&&", "||", "|", "(", "&", "exec")
            via_m = i >= 2 and tokens[i - 1] == "-m" and Path(tokens[i - 2]).name.startswith("python")
            if Path(tok).name == "orchestrator" and (at_start or via_m):
                rest = tokens[i + 1:]
                verb = rest[0] if rest else None
                positional = next((t for t in rest[1:] if not t.startswith("-") and "=" not in t), None)
                calls.append((source, verb, _resolve_var(positional, source) if positional else None))
    return calls


def test_orchestrator_commands_name_real_verbs():
    calls = orchestrator_calls()
    sources = {source for source, _, _ in calls}
    assert "deploy/kuberay/rayjob.yaml" in sources and "deploy/slurm/sweep.sbatch" in sources, calls
    for source, verb, _ in calls:
        assert verb in VERBS, f"{source}: `orchestrator {verb}` is not a CLI verb ({', '.join(VERBS)})"


def test_orchestrator_commands_name_existing_conf_files():
    calls = [(s, v, arg) for s, v, arg in orchestrator_calls() if v in CONFIG_VERBS]
    assert calls
    missing = sorted({f"{source}: {arg}" for source, _, arg in calls if arg is None or not (ROOT / arg).is_file()})
    assert not missing, f"deploy files name conf files that do not exist: {missing}"


# ---------------------------------------------------------------- KubeRay

_STR = {"type": "string", "minLength": 1}
_ENV = {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
    "name": _STR, "value": {"type": "string"},
    "valueFrom": {"type": "object", "properties": {"secretKeyRef": {
        "type": "object", "required": ["name", "key"], "properties": {"name": _STR, "key": _STR, "optional": {"type": "boolean"}}}}}},
    "oneOf": [{"required": ["value"]}, {"required": ["valueFrom"]}]}}
_QUANTITIES = {"type": "object", "additionalProperties": {"type": ["string", "integer"]}}
_POD_TEMPLATE = {"type": "object", "required": ["spec"], "properties": {"spec": {
    "type": "object", "required": ["containers"], "properties": {
        "containers": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["name", "image"], "properties": {
                "name": _STR, "image": _STR, "env": _ENV,
                "resources": {"type": "object", "properties": {"requests": _QUANTITIES, "limits": _QUANTITIES}},
                "volumeMounts": {"type": "array", "items": {"type": "object", "required": ["name", "mountPath"]}}}}},
        "volumes": {"type": "array", "items": {"type": "object", "required": ["name"]}}}}}}
_START_PARAMS = {"type": "object", "additionalProperties": {"type": "string"}}  # KubeRay wants strings
_CLUSTER_SPEC = {
    "type": "object", "required": ["headGroupSpec", "workerGroupSpecs"], "additionalProperties": False,
    "properties": {
        "rayVersion": _STR, "enableInTreeAutoscaling": {"type": "boolean"}, "suspend": {"type": "boolean"},
        "authOptions": {"type": "object", "properties": {"mode": {"enum": ["disabled", "token"]}, "secretName": _STR}},
        "autoscalerOptions": {"type": "object"}, "gcsFaultToleranceOptions": {"type": "object"},
        "headServiceAnnotations": {"type": "object"}, "managedBy": _STR, "upgradeStrategy": {"type": "object"},
        "headGroupSpec": {"type": "object", "required": ["rayStartParams", "template"], "additionalProperties": False,
                          "properties": {"rayStartParams": _START_PARAMS, "template": _POD_TEMPLATE,
                                         "serviceType": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
                                         "enableIngress": {"type": "boolean"}, "headService": {"type": "object"}}},
        "workerGroupSpecs": {"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False,
            "required": ["groupName", "replicas", "minReplicas", "maxReplicas", "rayStartParams", "template"],
            "properties": {"groupName": _STR, "replicas": {"type": "integer", "minimum": 0},
                           "minReplicas": {"type": "integer", "minimum": 0}, "maxReplicas": {"type": "integer", "minimum": 1},
                           "numOfHosts": {"type": "integer", "minimum": 1}, "idleTimeoutSeconds": {"type": "integer"},
                           "suspend": {"type": "boolean"}, "scaleStrategy": {"type": "object"},
                           "rayStartParams": _START_PARAMS, "template": _POD_TEMPLATE}}}}}
_META = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}}}
SCHEMAS = {
    "RayCluster": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "properties": {
        "apiVersion": {"const": "ray.io/v1"}, "kind": {"const": "RayCluster"}, "metadata": _META, "spec": _CLUSTER_SPEC}},
    "RayJob": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "properties": {
        "apiVersion": {"const": "ray.io/v1"}, "kind": {"const": "RayJob"}, "metadata": _META,
        "spec": {"type": "object", "additionalProperties": False,
                 "required": ["entrypoint", "rayClusterSpec", "shutdownAfterJobFinishes", "ttlSecondsAfterFinished"],
                 "properties": {
                     "entrypoint": _STR, "rayClusterSpec": _CLUSTER_SPEC, "shutdownAfterJobFinishes": {"type": "boolean"},
                     "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
                     "activeDeadlineSeconds": {"type": "integer", "minimum": 1}, "backoffLimit": {"type": "integer", "minimum": 0},
                     "submissionMode": {"enum": ["K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"]},
                     "runtimeEnvYAML": {"type": "string"}, "submitterPodTemplate": _POD_TEMPLATE,
                     "submitterConfig": {"type": "object"}, "clusterSelector": {"type": "object"},
                     "entrypointNumCpus": {"type": "number"}, "entrypointNumGpus": {"type": "number"},
                     "entrypointResources": {"type": "string"}, "suspend": {"type": "boolean"},
                     "deletionStrategy": {"type": "object"}, "managedBy": _STR, "metadata": {"type": "object"}}}}},
}


def cluster_specs():
    specs = [(p, d["spec"]) for p, d in kind("RayCluster")]
    specs += [(p, d["spec"]["rayClusterSpec"]) for p, d in kind("RayJob")]
    assert {p.name for p, _ in specs} >= {"raycluster.yaml", "rayjob.yaml"}
    return specs


def containers(spec, workers_only=False):
    groups = ([] if workers_only else [spec["headGroupSpec"]]) + spec["workerGroupSpecs"]
    return [(g, c) for g in groups for c in g["template"]["spec"]["containers"]]


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def test_kuberay_manifests_match_the_schema():
    found = kind("RayCluster") + kind("RayJob")
    assert {d["kind"] for _, d in found} == {"RayCluster", "RayJob"}
    for path, doc in found:
        jsonschema.validate(doc, SCHEMAS[doc["kind"]])
    for path, spec in cluster_specs():
        for group in spec["workerGroupSpecs"]:
            assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], (path, group["groupName"])


def test_gpu_workers_have_gpus_shm_and_bounded_resources():
    for path, spec in cluster_specs():
        for group, c in containers(spec, workers_only=True):
            req, lim = c["resources"]["requests"], c["resources"]["limits"]
            assert int(lim["nvidia.com/gpu"]) >= 1 and req["nvidia.com/gpu"] == lim["nvidia.com/gpu"], path
            for res in ("cpu", "memory"):
                assert res in req and res in lim, f"{path} {group['groupName']}: {res} request and limit"
            pod = group["template"]["spec"]
            shm = [m["name"] for m in c.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
            assert shm, f"{path}: no volume at /dev/shm (NCCL)"
            vol = next(v for v in pod["volumes"] if v["name"] == shm[0])
            assert vol["emptyDir"]["medium"] == "Memory", path


def test_token_auth_and_mlflow_from_secrets():
    for path, spec in cluster_specs():
        by_operator = spec.get("authOptions", {}).get("mode") == "token"
        assert spec["headGroupSpec"].get("serviceType", "ClusterIP") == "ClusterIP", f"{path}: head exposed"
        for group, c in containers(spec):
            env = env_of(c)
            if not by_operator:
                assert env.get("RAY_AUTH_MODE", {}).get("value") == "token", f"{path} {c['name']}: token auth off"
                assert "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"], f"{path}: token not from a Secret"
            assert "secretKeyRef" in env["MLFLOW_TRACKING_URI"]["valueFrom"], f"{path}: MLflow URI not from a Secret"


def test_no_literal_secrets_in_kubernetes_env():
    for path in YAMLS:
        for doc in docs(path):
            for c in _all_containers(doc):
                for e in c.get("env", []):
                    if re.search(r"TOKEN|PASSWORD|SECRET", e["name"]) and e["name"] != "RAY_AUTH_MODE":
                        assert "valueFrom" in e, f"{path}: {e['name']} is a literal; take it from a Secret"


def _all_containers(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "containers" and isinstance(v, list):
                yield from v
            else:
                yield from _all_containers(v)
    elif isinstance(node, list):
        for item in node:
            yield from _all_containers(item)


def test_rayjob_runs_a_sweep_and_cleans_up():
    (_, job), = kind("RayJob")
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] >= 0
    assert re.search(r"\borchestrator sweep conf/sweep/gpt-350m-cluster\.yaml\b", spec["entrypoint"])
    assert "'tracking.uri=${oc.env:MLFLOW_TRACKING_URI}'" in spec["entrypoint"]  # quoted: no shell expansion


# ---------------------------------------------------------------- VM cluster launcher

def test_vm_cluster_keeps_the_dashboard_local_and_has_gpu_nodes():
    (cfg,) = docs(DEPLOY / "vm" / "cluster.yaml")
    for key in ("cluster_name", "provider", "available_node_types", "head_node_type", "setup_commands",
                "head_start_ray_commands", "worker_start_ray_commands"):
        assert key in cfg, key
    assert "0.0.0.0" not in yaml.safe_dump(cfg), "something binds 0.0.0.0"
    head_start = " ".join(cfg["head_start_ray_commands"])
    assert "ray start --head" in head_start and "--dashboard-host=127.0.0.1" in head_start
    for cmd in cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"]:
        if "ray start" in cmd:
            assert "RAY_AUTH_MODE=token" in cmd, cmd
    types = [t["node_config"]["InstanceType"] for t in cfg["available_node_types"].values()]
    assert any(re.match(r"(g5|g6|g6e|p4d|p4de|p5)\.", t) for t in types), types
    setup = " ".join(cfg["setup_commands"])
    assert "torch==2.13.0" in setup and "download.pytorch.org/whl/cu128" in setup
    assert re.search(r"pip install .*-e ~/lm-orchestrator", setup)


# ---------------------------------------------------------------- Docker image

def _with_args(instructions):
    args = {}
    out = []
    for instr, arg in instructions:
        if instr == "ARG" and "=" in arg:
            name, _, value = arg.partition("=")
            args[name] = value.strip('"')
        for name, value in args.items():
            arg = arg.replace("${" + name + "}", value).replace("$" + name, value)
        out.append((instr, arg))
    return out


def test_dockerfile_cuda_torch_prebuilt_deepspeed_non_root():
    instructions = _with_args(_dockerfile_instructions(DOCKERFILE))
    froms = [arg for instr, arg in instructions if instr == "FROM"]
    assert froms and re.search(r"nvidia/cuda:12\.8[\w.-]*devel|rayproject/ray:[\w.-]*(gpu|cu12)", froms[-1]), froms
    runs = [arg for instr, arg in instructions if instr == "RUN"]
    torch_i = next(i for i, r in enumerate(runs) if "torch==2.13.0" in r)
    assert re.search(r"--(extra-)?index-url\s+\"?https://download\.pytorch\.org/whl/cu12\d", runs[torch_i]), runs[torch_i]
    ds_i = next(i for i, r in enumerate(runs) if re.search(r"pip install[^&]*\bdeepspeed\b", r))
    ds = runs[ds_i]
    assert "DS_BUILD_OPS=1" in ds or ("DS_BUILD_FUSED_ADAM=1" in ds and "DS_BUILD_CPU_ADAM=1" in ds), ds
    assert torch_i < ds_i, "DeepSpeed's ops must build against the CUDA torch installed first"
    users = [arg for instr, arg in instructions if instr == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), users


# ---------------------------------------------------------------- MLflow server

def test_mlflow_compose_binds_localhost_and_uses_postgres():
    (compose,) = docs(DEPLOY / "mlflow" / "docker-compose.yaml")
    services = compose["services"]
    for name, svc in services.items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond 127.0.0.1"
    assert "ports" not in services["postgres"]
    command = " ".join(services["mlflow"]["command"])
    assert re.search(r"--backend-store-uri postgresql://", command) and "--artifacts-destination" in command


def test_mlflow_kubernetes_manifest():
    objs = {(d["kind"], d["metadata"]["name"]): d for d in docs(DEPLOY / "mlflow" / "k8s.yaml")}
    deployment, service = objs[("Deployment", "mlflow")], objs[("Service", "mlflow")]
    assert ("StatefulSet", "postgres") in objs
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    command = " ".join(c["command"] + c.get("args", []))
    assert "--backend-store-uri postgresql://" in command and "--artifacts-destination" in command
    assert "secretKeyRef" in env_of(c)["POSTGRES_PASSWORD"]["valueFrom"]
    (pg,) = objs[("StatefulSet", "postgres")]["spec"]["template"]["spec"]["containers"]
    assert "secretKeyRef" in env_of(pg)["POSTGRES_PASSWORD"]["valueFrom"]


# ---------------------------------------------------------------- Slurm

def test_slurm_script_is_valid_bash_and_starts_and_stops_ray():
    bash = shutil.which("bash")
    assert bash
    proc = subprocess.run([bash, "-n", str(SBATCH)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = SBATCH.read_text()
    assert text.startswith("#!/bin/bash") and "#SBATCH --nodes=" in text
    assert re.search(r"srun .*\n?.*ray start --head --node-ip-address=\S+ --port=", text)
    assert "--dashboard-host=127.0.0.1" in text and "--block" in text
    assert re.search(r"ray start --address=", text)
    assert "trap cleanup EXIT" in text and "ray stop" in text
    assert "RAY_AUTH_MODE=token" in text
