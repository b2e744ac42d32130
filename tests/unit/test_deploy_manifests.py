"""deploy/: every manifest parses, names real CLI verbs and conf files, survives the shell that
runs it, fits the sweep it ships for, and keeps the security defaults (token auth, 127.0.0.1
bindings, secrets from Secrets, authenticated MLflow, restricted pods, pinned images).

No Kubernetes, Docker, cloud or Slurm here. What stands in for them: the KubeRay objects are
validated against KubeRay's own CRD schemas (vendored in tests/data/kuberay/, strict about unknown
fields like `kubectl apply`), the other pod templates against the pod schema embedded in those
CRDs; the RayJob entrypoint runs through the `bash -c` string KubeRay's submitter builds, with a
fake `ray`; the VM config is validated against the schema of the installed Ray's cluster launcher;
the cluster shapes go through orchestrator.formulas.feasibility.
"""

import configparser
import copy
import functools
import json
import re
import shlex
import shutil
import subprocess
import sys
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
MLFLOW_DOCKERFILE = DEPLOY / "mlflow" / "Dockerfile"
CRDS = ROOT / "tests" / "data" / "kuberay"
CONFIG_VERBS = {"plan", "train", "sweep", "submit", "prepare"}  # their first argument is a conf file
COMMAND_KEYS = {
    "entrypoint",
    "command",
    "args",
    "setup_commands",
    "head_setup_commands",
    "worker_setup_commands",
    "initialization_commands",
    "head_start_ray_commands",
    "worker_start_ray_commands",
}
RAY_POD_LABEL = {"app.kubernetes.io/name": "lm-orchestrator"}  # what MLflow's NetworkPolicy admits


def docs(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def kind(name):
    return [(p, d) for p in YAMLS for d in docs(p) if isinstance(d, dict) and d.get("kind") == name]


def k8s_objects(path):
    return {(d["kind"], d["metadata"]["name"]): d for d in docs(path)}


def quantity(value):
    """A Kubernetes quantity ("32", "500m", "64Gi", "2G") as a number (bytes, cores)."""
    units = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    number, unit = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(value)).groups()
    return float(number) * units.get(unit, 1)


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
    """(key, shell command) for the keys that hold commands, anywhere in a document."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _yaml_commands(v, k)
    elif isinstance(node, list):
        if key in ("command", "args") and all(isinstance(x, str) for x in node):
            shell = len(node) >= 3 and key == "command" and re.fullmatch(r"-\w*c\w*", node[1])  # sh -c / -ec SCRIPT
            yield key, node[-1] if shell else shlex.join(node)
        else:
            for item in node:
                yield from _yaml_commands(item, key)
    elif isinstance(node, str) and key in COMMAND_KEYS:
        yield key, node


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


def _with_args(instructions):
    """ARG defaults substituted into the later instructions."""
    args, out = {}, []
    for instr, arg in instructions:
        if instr == "ARG" and "=" in arg:
            name, _, value = arg.partition("=")
            args[name] = value.strip('"')
        for name, value in args.items():
            arg = arg.replace("${" + name + "}", value).replace("$" + name, value)
        out.append((instr, arg))
    return out


def _shell_lines(path):
    text = re.sub(r"<<'EOF'\n.*?\nEOF\n", "\n", path.read_text(), flags=re.S)  # heredoc bodies are Python
    return [
        line for line in text.replace("\\\n", " ").splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def all_commands():
    """(source, shell command, whole) for every command the deploy files run. `whole`: a RayJob
    entrypoint, which must be ONE command (KubeRay splices it into its own shell string, so a
    `&&` in it is not a boundary between two commands of ours: see the KubeRay tests below)."""
    cmds = [
        (str(p.relative_to(ROOT)), c, key == "entrypoint")
        for p in YAMLS
        for d in docs(p)
        for key, c in _yaml_commands(d)
    ]
    cmds += [(str(SBATCH.relative_to(ROOT)), line, False) for line in _shell_lines(SBATCH)]
    cmds += [
        (str(DOCKERFILE.relative_to(ROOT)), arg, False)
        for instr, arg in _dockerfile_instructions(DOCKERFILE)
        if instr in ("RUN", "CMD", "ENTRYPOINT")
    ]
    return cmds


def image_workdir():
    """The image's working directory (the project is copied there): /app."""
    return [arg for instr, arg in _dockerfile_instructions(DOCKERFILE) if instr == "WORKDIR"][-1]


def in_project(path):
    """A conf path as the deploy files name it -> the file in this checkout (/app/... is the image's copy)."""
    workdir = image_workdir().rstrip("/") + "/"
    return ROOT / (path[len(workdir) :] if path.startswith(workdir) else path)


def _resolve_var(token, source):
    """`"$SWEEP"` in the sbatch script -> the default of its assignment `SWEEP="${1:-conf/...}"`."""
    match = re.fullmatch(r"\$\{?(\w+)\}?", token)
    if not match:
        return token
    text = (ROOT / source).read_text()
    assign = re.search(rf"^{match.group(1)}=\"?\$\{{\w+:-([^}}]+)\}}\"?", text, re.M) or re.search(
        rf"^{match.group(1)}=\"?([^\"\s]+)", text, re.M
    )
    return assign.group(1) if assign else token


def orchestrator_calls():
    """(source, verb, first positional argument) for each `orchestrator VERB ...` / `python -m orchestrator`.
    In shell scripts a call may follow `;`, `&&`, ...; a RayJob entrypoint must BE the call."""
    calls = []
    for source, cmd, whole in all_commands():
        lexer = shlex.shlex(cmd, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        tokens = list(lexer)
        for i, tok in enumerate(tokens):
            after_operator = not whole and i > 0 and tokens[i - 1] in (";", "&&", "||", "|", "(", "&", "exec")
            via_m = (
                i >= 2
                and tokens[i - 1] == "-m"
                and Path(tokens[i - 2]).name.startswith("python")
                and (not whole or i == 2)
            )
            if Path(tok).name == "orchestrator" and (i == 0 or after_operator or via_m):
                rest = tokens[i + 1 :]
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
    missing = sorted({f"{source}: {arg}" for source, _, arg in calls if arg is None or not in_project(arg).is_file()})
    assert not missing, f"deploy files name conf files that do not exist: {missing}"


# ---------------------------------------------------------------- KubeRay: the CRD schemas


def _json_schema(node):
    """Kubernetes' OpenAPI v3 schema -> JSON Schema as strict as the API server with field
    validation: objects that declare `properties` accept no other field, unless marked
    x-kubernetes-preserve-unknown-fields; int-or-string is either; other x- keys are dropped."""
    out = {}
    for key, value in node.items():
        if key.startswith("x-") or key == "nullable":
            continue
        if key == "properties":
            out[key] = {name: _json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = _json_schema(value)
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [_json_schema(sub) for sub in value]
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if node.get("nullable") and "type" in out:
        out["type"] = [*([out["type"]] if isinstance(out["type"], str) else out["type"]), "null"]
    if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    return out


@functools.cache
def crd_schema(kind_name):
    """spec.versions[name=v1].schema.openAPIV3Schema of the vendored CRD, as JSON Schema."""
    path = CRDS / {"RayJob": "ray.io_rayjobs.yaml", "RayCluster": "ray.io_rayclusters.yaml"}[kind_name]
    crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    assert crd["kind"] == "CustomResourceDefinition" and crd["spec"]["names"]["kind"] == kind_name
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return _json_schema(v1["schema"]["openAPIV3Schema"])


def schema_errors(doc, schema=None):
    validator = jsonschema.Draft7Validator(schema or crd_schema(doc["kind"]))
    return sorted(f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(doc))


def cluster_specs():
    specs = [(p, d["spec"]) for p, d in kind("RayCluster")]
    specs += [(p, d["spec"]["rayClusterSpec"]) for p, d in kind("RayJob")]
    assert {p.name for p, _ in specs} >= {"raycluster.yaml", "rayjob.yaml"}
    return specs


def groups(spec):
    return [spec["headGroupSpec"], *spec["workerGroupSpecs"]]


def containers(spec, workers_only=False):
    return [
        (g, c)
        for g in (spec["workerGroupSpecs"] if workers_only else groups(spec))
        for c in g["template"]["spec"]["containers"]
    ]


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def test_kuberay_manifests_match_the_crd_schemas():
    found = kind("RayCluster") + kind("RayJob")
    assert {d["kind"] for _, d in found} == {"RayCluster", "RayJob"}
    for path, doc in found:
        assert doc["apiVersion"] == "ray.io/v1", path
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"]), path  # a DNS label
        errors = schema_errors(doc)
        assert not errors, f"{path} does not match KubeRay's {doc['kind']} CRD:\n" + "\n".join(errors)
    for path, spec in cluster_specs():
        for group in spec["workerGroupSpecs"]:
            assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], (path, group["groupName"])


def test_the_crd_schema_rejects_misspelt_fields_and_wrong_types():
    # The validator must bite, or the test above proves nothing.
    ((_, job),) = kind("RayJob")
    bad = copy.deepcopy(job)
    bad["spec"]["shutdownAfterJobFinish"] = bad["spec"].pop("shutdownAfterJobFinishes")
    assert any("'shutdownAfterJobFinish' was unexpected" in e for e in schema_errors(bad)), schema_errors(bad)
    # deep in a pod template, where a typo would silently drop a security setting
    bad = copy.deepcopy(job)
    bad["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["securityContext"]["runAsNonroot"] = True
    assert any("runAsNonroot" in e for e in schema_errors(bad)), schema_errors(bad)
    # KubeRay wants rayStartParams as strings
    bad = copy.deepcopy(job)
    bad["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0
    assert any("rayStartParams.num-cpus" in e for e in schema_errors(bad)), schema_errors(bad)


def pod_template_schema():
    """core/v1 PodTemplateSpec as KubeRay's CRD embeds it (the head group's `template`)."""
    return crd_schema("RayCluster")["properties"]["spec"]["properties"]["headGroupSpec"]["properties"]["template"]


def workload_pod_templates(doc):
    """The pod template of a Deployment, StatefulSet, Job or CronJob."""
    if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
        return [doc["spec"]["template"]]
    if doc["kind"] == "CronJob":
        return [doc["spec"]["jobTemplate"]["spec"]["template"]]
    return []


def test_other_pod_templates_match_the_kubernetes_pod_schema():
    templates = [
        (p, d["kind"], t)
        for p in YAMLS
        for d in docs(p)
        if isinstance(d, dict) and "kind" in d
        for t in workload_pod_templates(d)
    ]
    assert {k for _, k, _ in templates} >= {"Deployment", "StatefulSet", "CronJob"}
    for path, kind_name, template in templates:
        errors = schema_errors(template, pod_template_schema())
        assert not errors, f"{path} {kind_name}: pod template does not match the pod schema:\n" + "\n".join(errors)
    assert schema_errors(
        {"spec": {"containers": [{"name": "x", "imagePullPolicy": "Always", "imag": "x"}]}}, pod_template_schema()
    ), "the pod schema accepts a misspelt field"


# ---------------------------------------------------------------- KubeRay: the RayJob entrypoint

JOB_ID = "gpt-350m-sweep-7x2kq"
DASHBOARD = "http://gpt-350m-sweep-raycluster-abcde-head-svc.default.svc.cluster.local:8265"
FAKE_RAY = """#!{python}
import json, os, sys
with open(os.environ["FAKE_RAY_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
# `ray job status ID` fails: the job is not there yet, so the submitter submits it.
sys.exit(1 if sys.argv[1:3] == ["job", "status"] else 0)
"""


def kuberay_submitter_script(entrypoint):
    """The string KubeRay's submitter Job runs as `/bin/bash -ce -- STRING` for a RayJob in
    K8sJobMode: BuildJobSubmitCommand (ray-operator/controllers/ray/common/job.go), its words
    joined by spaces, the entrypoint spliced in as it is (trimmed)."""
    words = [
        "if",
        "!",
        "ray",
        "job",
        "status",
        "--address",
        DASHBOARD,
        JOB_ID,
        ">/dev/null",
        "2>&1",
        ";",
        "then",
        "ray",
        "job",
        "submit",
        "--address",
        DASHBOARD,
        "--no-wait",
        "--submission-id",
        JOB_ID,
        "--",
        entrypoint.strip(),
        ";",
        "fi",
        ";",
        "ray",
        "job",
        "logs",
        "--address",
        DASHBOARD,
        "--follow",
        JOB_ID,
    ]
    return " ".join(words)


def run_like_kuberay(entrypoint, tmp_path):
    """(process, the argv of every `ray` call). PATH holds the fake `ray` only: any other
    program the string would start fails (exit 127, a line on stderr)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    ray = bin_dir / "ray"
    ray.write_text(FAKE_RAY.format(python=sys.executable))
    ray.chmod(0o755)
    log = tmp_path / "ray-calls.jsonl"
    proc = subprocess.run(
        [shutil.which("bash"), "-ce", "--", kuberay_submitter_script(entrypoint)],
        env={"PATH": str(bin_dir), "FAKE_RAY_LOG": str(log)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, calls


def expected_ray_calls(entrypoint):
    return [
        ["job", "status", "--address", DASHBOARD, JOB_ID],
        [
            "job",
            "submit",
            "--address",
            DASHBOARD,
            "--no-wait",
            "--submission-id",
            JOB_ID,
            "--",
            *shlex.split(entrypoint),
        ],
        ["job", "logs", "--address", DASHBOARD, "--follow", JOB_ID],
    ]


def test_rayjob_entrypoints_reach_ray_job_submit_whole(tmp_path):
    jobs = kind("RayJob")
    assert jobs
    for n, (path, job) in enumerate(jobs):
        entrypoint = job["spec"]["entrypoint"]
        proc, calls = run_like_kuberay(entrypoint, tmp_path / str(n))
        assert proc.returncode == 0 and not proc.stderr, f"{path}: KubeRay's shell failed: {proc.stderr}"
        # Ray gets the whole entrypoint after `--`, and nothing but the three ray calls runs.
        assert calls == expected_ray_calls(entrypoint), f"{path}: the submitter ran {calls}"


def test_the_kuberay_shell_check_catches_a_split_entrypoint(tmp_path):
    # The entrypoint this file used to ship: Ray received `cd /app`, the sweep ran in the submitter.
    entrypoint = "cd /app && orchestrator sweep conf/sweep/gpt-350m-cluster.yaml"
    proc, calls = run_like_kuberay(entrypoint, tmp_path)
    assert calls[1][calls[1].index("--") + 1 :] == ["cd", "/app"]
    assert calls != expected_ray_calls(entrypoint) and proc.returncode != 0  # `orchestrator` is not on PATH
    assert shell_operators(entrypoint) == ["&&"]


def shell_operators(command):
    """Shell operators outside quotes, plus command substitution anywhere."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    found = [tok for tok in lexer if tok and set(tok) <= set("();<>|&")]
    return found + [s for s in ("`", "$(") if s in command]


def test_rayjob_entrypoints_have_no_shell_operators():
    for path, job in kind("RayJob"):
        ops = shell_operators(job["spec"]["entrypoint"])
        assert not ops, (
            f"{path}: the RayJob entrypoint holds shell operators {ops}. KubeRay splices it into "
            f"one `bash -c` string after `ray job submit ... --`, so they split it there and only "
            f"the first command reaches Ray. Use one command (python -m orchestrator sweep /app/...)."
        )


def test_rayjob_runs_the_cluster_sweep_with_absolute_paths_and_cleans_up():
    ((_, job),) = kind("RayJob")
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] >= 0
    argv = shlex.split(spec["entrypoint"])
    assert argv[:4] == ["python", "-m", "orchestrator", "sweep"], argv
    # The job's working directory is Ray's choice, not the image's: every path is absolute.
    assert argv[4] == f"{image_workdir()}/conf/sweep/gpt-350m-cluster.yaml", argv
    assert ("COPY", "conf ./conf") in _dockerfile_instructions(DOCKERFILE), "the image has no conf/ in its WORKDIR"
    overrides = dict(arg.split("=", 1) for arg in argv[5:])
    assert overrides["tracking.uri"] == "${oc.env:MLFLOW_TRACKING_URI}"  # quoted in the YAML: no shell expansion
    assert overrides["train.storage_path"].startswith("/mnt/shared/"), overrides
    for _, c in containers(spec["rayClusterSpec"]):
        assert c.get("workingDir") == image_workdir(), c["name"]
        # the token cache (workloads/text/corpus.py) on the shared volume, not relative to a cwd
        assert env_of(c)["ORCHESTRATOR_CACHE_DIR"]["value"].startswith("/mnt/shared/"), c["name"]


# ---------------------------------------------------------------- KubeRay: resources and auth


def test_gpu_workers_have_gpus_and_bounded_resources():
    for path, spec in cluster_specs():
        for group, c in containers(spec, workers_only=True):
            req, lim = c["resources"]["requests"], c["resources"]["limits"]
            assert int(lim["nvidia.com/gpu"]) >= 1 and req["nvidia.com/gpu"] == lim["nvidia.com/gpu"], path
            for res in ("cpu", "memory"):
                assert res in req and res in lim, f"{path} {group['groupName']}: {res} request and limit"


def test_object_store_fits_in_dev_shm_within_the_memory_limit():
    # Ray puts its object store in /dev/shm when it fits there (else a slower file in /tmp);
    # a memory-backed emptyDir counts against the container's memory limit.
    for path, spec in cluster_specs():
        for group in groups(spec):
            pod = group["template"]["spec"]
            c = pod["containers"][0]
            (shm,) = [m["name"] for m in c.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
            volume = next(v for v in pod["volumes"] if v["name"] == shm)
            assert volume["emptyDir"]["medium"] == "Memory", path
            store = int(group["rayStartParams"]["object-store-memory"])  # bytes, as a string
            shm_size, memory = quantity(volume["emptyDir"]["sizeLimit"]), quantity(c["resources"]["limits"]["memory"])
            assert store <= shm_size <= memory, (
                f"{path} {c['name']}: object store {store}, /dev/shm {shm_size}, limit {memory}"
            )


def test_token_auth_and_mlflow_from_secrets():
    for path, spec in cluster_specs():
        by_operator = spec.get("authOptions", {}).get("mode") == "token"
        assert spec["headGroupSpec"].get("serviceType", "ClusterIP") == "ClusterIP", f"{path}: head exposed"
        for _group, c in containers(spec):
            env = env_of(c)
            if not by_operator:
                assert env.get("RAY_AUTH_MODE", {}).get("value") == "token", f"{path} {c['name']}: token auth off"
                assert "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"], f"{path}: token not from a Secret"
            for name in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
                assert "secretKeyRef" in env[name]["valueFrom"], f"{path}: {name} not from a Secret"


def test_ray_pods_carry_the_label_mlflow_admits():
    for path, spec in cluster_specs():
        for group in groups(spec):
            labels = group["template"].get("metadata", {}).get("labels", {})
            assert RAY_POD_LABEL.items() <= labels.items(), f"{path}: a Ray pod template lacks {RAY_POD_LABEL}"


# ---------------------------------------------------------------- cluster shapes

# A trial of conf/sweep/gpt-350m-cluster.yaml: 8 Ray Train workers of {CPU 7, GPU 1}, packed,
# plus 0.2 CPU for the Tune trial (orchestrator.driver.sweep.TRIAL_DRIVER_CPUS).
TRIAL = {"workers": 8, "per_worker": {"CPU": 7, "GPU": 1}, "strategy": "PACK", "trial": {"CPU": 0.2}}


def test_the_cluster_sweep_asks_for_the_trial_shape_the_deploy_files_are_sized_for():
    from orchestrator.core import config

    sweep = yaml.safe_load((ROOT / "conf/sweep/gpt-350m-cluster.yaml").read_text())
    assert not [k for k in sweep.get("space", {}) if k.startswith("cluster.")], "trials differ in shape"
    base = ROOT / "conf/sweep" / sweep["base"]["config"]
    cfg = config.load(base, [f"{k}={v}" for k, v in sweep["base"]["overrides"].items()], validate_config=False)
    shape = (
        cfg.cluster.num_workers,
        {"CPU": cfg.cluster.cpus_per_worker, "GPU": int(cfg.cluster.use_gpu)},
        cfg.cluster.placement_strategy,
    )
    assert shape == (TRIAL["workers"], TRIAL["per_worker"], TRIAL["strategy"])


def kuberay_nodes(spec):
    """The Ray nodes a KubeRay cluster has, or can autoscale to: the head's rayStartParams
    (num-cpus, num-gpus) else its limits; each worker group's limits x replicas (maxReplicas
    when the autoscaler is on)."""

    def node(group):
        params, limits = group["rayStartParams"], group["template"]["spec"]["containers"][0]["resources"]["limits"]
        return {
            "CPU": float(params.get("num-cpus", quantity(limits["cpu"]))),
            "GPU": float(params.get("num-gpus", limits.get("nvidia.com/gpu", 0))),
        }

    autoscaling = spec.get("enableInTreeAutoscaling", False)
    nodes = [node(spec["headGroupSpec"])]
    for group in spec["workerGroupSpecs"]:
        nodes += [node(group)] * group["maxReplicas" if autoscaling else "replicas"]
    return nodes


def slurm_nodes():
    """The sbatch defaults: --nodes of --cpus-per-task CPUs and --gpus-per-node GPUs, the head included."""
    text = SBATCH.read_text()
    sbatch = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, re.M))
    # both `ray start`s declare the allocation's CPUs and GPUs (the head takes trials too)
    assert len(re.findall(r'ray start --head [^\n]*\n?[^\n]*--num-cpus="\$CPUS" --num-gpus="\$GPUS"', text)) == 1
    assert len(re.findall(r'ray start --address=[^\n]*--num-cpus="\$CPUS" --num-gpus="\$GPUS"', text)) == 1
    assert 'CPUS="${SLURM_CPUS_PER_TASK:-32}"' in text and 'GPUS="${SLURM_GPUS_PER_NODE:-4}"' in text
    return [{"CPU": float(sbatch["cpus-per-task"]), "GPU": float(sbatch["gpus-per-node"])}] * int(sbatch["nodes"])


def shipped_clusters():
    clusters = [(str(path.relative_to(ROOT)), kuberay_nodes(spec)) for path, spec in cluster_specs()]
    return clusters + [(str(SBATCH.relative_to(ROOT)), slurm_nodes())]


def test_shipped_clusters_fit_a_trial_of_the_cluster_sweep():
    from orchestrator.formulas.feasibility import Shape, fits

    shape = Shape(TRIAL["workers"], TRIAL["per_worker"], TRIAL["strategy"], TRIAL["trial"])
    for source, nodes in shipped_clusters():
        assert fits(shape, nodes), f"{source}: a trial of {shape.describe()} never starts on {nodes}"
    # The shape issue 12 found: 8 CPUs per worker (64.2 CPUs) does not fit two 32-CPU workers.
    too_big = Shape(8, {"CPU": 8, "GPU": 1}, "PACK", {"CPU": 0.2})
    ((_, raycluster),) = kind("RayCluster")
    assert not fits(too_big, kuberay_nodes(raycluster["spec"]))


# ---------------------------------------------------------------- pods: restricted, non-root


def pod_specs():
    """(source, where, pod spec) for every pod the Kubernetes manifests make: any object with `containers`."""

    def walk(node, where):
        if isinstance(node, dict):
            if isinstance(node.get("containers"), list):
                yield where, node
            for k, v in node.items():
                yield from walk(v, f"{where}.{k}")
        elif isinstance(node, list):
            for i, item in enumerate(node):
                yield from walk(item, f"{where}[{i}]")

    return [
        (str(p.relative_to(ROOT)), f"{d['kind']}/{d['metadata']['name']}{w}", spec)
        for p in YAMLS
        for d in docs(p)
        if isinstance(d, dict) and "kind" in d
        for w, spec in walk(d, "")
    ]


def restricted_violations(pod):
    """What the "restricted" Pod Security Standard refuses in a pod spec (Kubernetes >= 1.25)."""
    bad, pod_sc = [], pod.get("securityContext", {})
    bad += [key for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key)]
    bad += [f"hostPath volume {v['name']}" for v in pod.get("volumes", []) if "hostPath" in v]
    for c in pod.get("initContainers", []) + pod["containers"]:
        sc = c.get("securityContext", {})
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            bad.append(f"{c['name']}: runAsNonRoot is not true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            bad.append(f"{c['name']}: runAsUser 0")
        if sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type") not in (
            "RuntimeDefault",
            "Localhost",
        ):
            bad.append(f"{c['name']}: no seccompProfile RuntimeDefault")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{c['name']}: allowPrivilegeEscalation is not false")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            bad.append(f"{c['name']}: capabilities not dropped (drop: [ALL])")
        if set(sc.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            bad.append(f"{c['name']}: capabilities added")
        if sc.get("privileged"):
            bad.append(f"{c['name']}: privileged")
    return bad


def test_every_pod_passes_the_restricted_pod_security_standard():
    pods = pod_specs()
    wheres = " ".join(w for _, w, _ in pods)
    for expected in (
        "RayCluster",
        "RayJob",
        "submitterPodTemplate",
        "Deployment/mlflow",
        "StatefulSet/postgres",
        "CronJob/postgres-backup",
    ):
        assert expected in wheres, f"no pod of {expected} found"
    for source, where, pod in pods:
        assert not restricted_violations(pod), f"{source} {where}: {restricted_violations(pod)}"
        # the pod-level settings, so containers KubeRay adds (init, autoscaler) inherit them
        assert pod["securityContext"]["runAsNonRoot"] is True, f"{source} {where}"
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, f"{source} {where}"
    assert restricted_violations({"containers": [{"name": "bare"}]}), "the checker lets a bare pod through"


def test_kuberay_autoscaler_sidecar_is_restricted_too():
    # KubeRay adds the autoscaler container to the head pod with autoscalerOptions.securityContext.
    for path, spec in cluster_specs():
        if spec.get("enableInTreeAutoscaling"):
            sc = spec["autoscalerOptions"]["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], path


def dockerfile_uid(path):
    """The numeric uid the image runs as: its last USER, numeric or a user made with useradd --uid."""
    instructions = _dockerfile_instructions(path)
    user = [arg for instr, arg in instructions if instr == "USER"][-1].split(":")[0]
    if user.isdigit():
        return int(user)
    created = re.search(rf"useradd [^&]*--uid (\d+)[^&]* {user}\b", " ".join(a for i, a in instructions if i == "RUN"))
    return int(created.group(1)) if created else None


def image_uid(image):
    if "/lm-orchestrator:" in image:
        return dockerfile_uid(DOCKERFILE)
    if "/orchestrator-mlflow:" in image:
        return dockerfile_uid(MLFLOW_DOCKERFILE)
    if image.startswith("postgres:"):
        return 999  # the `postgres` user of the official Debian-based image
    raise AssertionError(f"which user does {image} run as?")


def test_pods_run_as_the_images_non_root_user():
    for path in (DOCKERFILE, MLFLOW_DOCKERFILE):
        uid = dockerfile_uid(path)
        assert uid not in (None, 0), f"{path}: no numeric non-root USER"
        runs = " ".join(a for i, a in _dockerfile_instructions(path) if i == "RUN")
        assert f"--uid {uid}" in runs, f"{path}: USER {uid} is not the user it creates"
    for source, where, pod in pod_specs():
        for c in pod["containers"]:
            assert pod["securityContext"].get("runAsUser") == image_uid(c["image"]), f"{source} {where} {c['name']}"


# ---------------------------------------------------------------- images


def all_images():
    """(source, image) for every image the deploy files run or build from."""

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "image" and isinstance(v, str):
                    yield v
                else:
                    yield from walk(v)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)

    images = [(str(p.relative_to(ROOT)), image) for p in YAMLS for d in docs(p) for image in walk(d)]
    for path in (DOCKERFILE, MLFLOW_DOCKERFILE):
        images += [
            (str(path.relative_to(ROOT)), arg.split()[0])
            for instr, arg in _with_args(_dockerfile_instructions(path))
            if instr == "FROM"
        ]
    return images


def pinned(image):
    """A digest, or a tag with at least major.minor (PostgreSQL numbers its releases major.minor)."""
    if re.search(r"@sha256:[0-9a-f]{64}$", image):
        return True
    tag = image.rsplit("/", 1)[-1].partition(":")[2]
    return bool(re.fullmatch(r"v?\d+\.\d+(\.\d+)*([-+_.][\w.-]+)?", tag))


def test_images_are_pinned():
    images = all_images()
    assert {s for s, _ in images} >= {
        "deploy/kuberay/rayjob.yaml",
        "deploy/mlflow/k8s.yaml",
        "deploy/mlflow/docker-compose.yaml",
        "deploy/docker/Dockerfile",
    }
    for source, image in images:
        assert "latest" not in image and pinned(image), f"{source}: {image} is not pinned (a version tag or @sha256:)"
    for floating in ("postgres:16", "postgres", "ghcr.io/mlflow/mlflow:latest", "localhost:5000/x"):
        assert not pinned(floating), floating


# ---------------------------------------------------------------- secrets


def test_no_literal_secrets_in_kubernetes_env():
    for path in YAMLS:
        for doc in docs(path):
            for c in _all_containers(doc):
                for e in c.get("env", []):
                    if re.search(r"TOKEN|PASSWORD|SECRET|PGPASS", e["name"]) and e["name"] != "RAY_AUTH_MODE":
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


CREDENTIALS_IN_URI = re.compile(r"://[^/\s:@]+:[^@\s/]+@")


def process_arguments():
    """(source, text) for every process's arguments: Kubernetes command/args, compose commands
    and healthchecks, the lines of local-server.sh."""
    out = []
    for path in YAMLS:
        for doc in docs(path):
            out += [(str(path), " ".join(c.get("command", []) + c.get("args", []))) for c in _all_containers(doc)]
    (compose,) = docs(DEPLOY / "mlflow" / "docker-compose.yaml")
    for name, svc in compose["services"].items():
        for part in (svc.get("command", []), svc.get("healthcheck", {}).get("test", [])):
            out.append((f"compose {name}", part if isinstance(part, str) else " ".join(part)))
    out += [("deploy/mlflow/local-server.sh", line) for line in _shell_lines(DEPLOY / "mlflow" / "local-server.sh")]
    return out


def test_passwords_are_in_no_process_arguments():
    # Arguments are world-readable (`ps`, /proc/PID/cmdline); environment variables are not.
    args = process_arguments()
    assert any(text.startswith("mlflow server") for _, text in args)
    for source, text in args:
        assert not re.search(r"PASSWORD|PGPASS(?!FILE)|SECRET", text), (
            f"{source}: a secret in process arguments: {text}"
        )
        assert not CREDENTIALS_IN_URI.search(text), f"{source}: credentials in a URI argument: {text}"
    assert CREDENTIALS_IN_URI.search("postgresql://mlflow:$(POSTGRES_PASSWORD)@postgres:5432/mlflow")


def test_mlflow_env_file_stays_out_of_git_and_the_image():
    ignored = (DEPLOY / "docker" / "Dockerfile.dockerignore").read_text().splitlines()
    assert "deploy/mlflow/.env" in ignored
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("no git checkout")
    proc = subprocess.run([git, "check-ignore", "-q", "deploy/mlflow/.env"], cwd=ROOT)
    assert proc.returncode == 0, "deploy/mlflow/.env (the passwords) is not ignored by git"


# ---------------------------------------------------------------- VM cluster launcher


def test_vm_cluster_keeps_the_dashboard_local_and_has_gpu_nodes():
    (cfg,) = docs(DEPLOY / "vm" / "cluster.yaml")
    for key in (
        "cluster_name",
        "provider",
        "available_node_types",
        "head_node_type",
        "setup_commands",
        "head_start_ray_commands",
        "worker_start_ray_commands",
    ):
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


def test_vm_cluster_matches_the_cluster_launcher_schema():
    import ray

    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    (cfg,) = docs(DEPLOY / "vm" / "cluster.yaml")
    jsonschema.Draft7Validator(schema).validate(cfg)
    assert list(jsonschema.Draft7Validator(schema).iter_errors({**cfg, "head_setup_comands": []}))


def test_vm_head_can_launch_workers_and_ssh_is_not_open_to_the_world():
    (cfg,) = docs(DEPLOY / "vm" / "cluster.yaml")
    # The autoscaler runs on the head, in the venv's Python, and calls AWS through boto3.
    head_setup = " ".join(cfg.get("head_setup_commands", []) + cfg["setup_commands"])
    assert re.search(r"~/venv/bin/pip install [^;&|]*\bboto3\b", head_setup), "boto3 is not installed on the head"
    rules = cfg["provider"]["security_group"]["IpPermissions"]
    assert cfg["provider"]["security_group"]["GroupName"]
    for rule in rules:
        for cidr in [r["CidrIp"] for r in rule.get("IpRanges", [])] + [
            r["CidrIpv6"] for r in rule.get("Ipv6Ranges", [])
        ]:
            assert cidr not in ("0.0.0.0/0", "::/0"), f"security group admits the world: {rule}"
    ssh = [r for r in rules if r["FromPort"] <= 22 <= r["ToPort"]]
    assert ssh and all(r["CidrIp"].endswith("/32") for rule in ssh for r in rule["IpRanges"]), ssh


# ---------------------------------------------------------------- Docker image


def test_dockerfile_cuda_torch_prebuilt_deepspeed_non_root():
    instructions = _with_args(_dockerfile_instructions(DOCKERFILE))
    froms = [arg for instr, arg in instructions if instr == "FROM"]
    assert froms and re.search(r"nvidia/cuda:12\.8[\w.-]*devel|rayproject/ray:[\w.-]*(gpu|cu12)", froms[-1]), froms
    runs = [arg for instr, arg in instructions if instr == "RUN"]
    torch_i = next(i for i, r in enumerate(runs) if "torch==2.13.0" in r)
    assert re.search(r"--(extra-)?index-url\s+\"?https://download\.pytorch\.org/whl/cu12\d", runs[torch_i]), runs[
        torch_i
    ]
    ds_i = next(i for i, r in enumerate(runs) if re.search(r"pip install[^&]*\bdeepspeed\b", r))
    ds = runs[ds_i]
    assert "DS_BUILD_OPS=1" in ds or ("DS_BUILD_FUSED_ADAM=1" in ds and "DS_BUILD_CPU_ADAM=1" in ds), ds
    assert torch_i < ds_i, "DeepSpeed's ops must build against the CUDA torch installed first"
    assert dockerfile_uid(DOCKERFILE) not in (None, 0)


# ---------------------------------------------------------------- MLflow server


def auth_ini(text):
    ini = configparser.ConfigParser()
    ini.read_string(text)
    return ini["mlflow"]


def check_auth_config(ini, source):
    """No secret in the ini: the admin password and the database password come from the environment."""
    assert "admin_password" not in ini, f"{source}: admin password in the config; use MLFLOW_AUTH_ADMIN_PASSWORD"
    assert ini["database_uri"].startswith("postgresql://") and not CREDENTIALS_IN_URI.search(ini["database_uri"]), (
        source
    )
    assert ini["authorization_function"] == "mlflow.server.auth:authenticate_request_basic_auth", source


def check_mlflow_env(env, source):
    """env: name -> value (compose) or name -> env entry (Kubernetes)."""
    uri = env["MLFLOW_BACKEND_STORE_URI"]
    uri = uri if isinstance(uri, str) else uri["value"]
    assert uri.startswith("postgresql://") and not CREDENTIALS_IN_URI.search(uri), f"{source}: {uri}"
    for name in (
        "PGPASSWORD",
        "MLFLOW_AUTH_ADMIN_PASSWORD",
        "MLFLOW_FLASK_SERVER_SECRET_KEY",
        "MLFLOW_AUTH_CONFIG_PATH",
    ):
        assert name in env, f"{source}: no {name}"


def test_mlflow_compose_binds_localhost_authenticates_and_keeps_passwords_in_env():
    (compose,) = docs(DEPLOY / "mlflow" / "docker-compose.yaml")
    services = compose["services"]
    for name, svc in services.items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond 127.0.0.1"
    assert "ports" not in services["postgres"]
    mlflow = services["mlflow"]
    assert (
        mlflow["command"][:4] == ["mlflow", "server", "--app-name", "basic-auth"]
        and "--artifacts-destination" in mlflow["command"]
    )
    env = mlflow["environment"]
    check_mlflow_env(env, "docker-compose.yaml")
    for name in ("PGPASSWORD", "MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY"):
        assert re.fullmatch(r"\$\{\w+:\?[^}]+\}", env[name]), f"{name} must come from .env, not the file"
    mounts = {v.split(":")[1]: v.split(":")[0] for v in mlflow["volumes"]}
    ini_file = DEPLOY / "mlflow" / mounts[env["MLFLOW_AUTH_CONFIG_PATH"]]
    check_auth_config(auth_ini(ini_file.read_text()), ini_file.name)


def test_mlflow_kubernetes_manifest():
    objs = k8s_objects(DEPLOY / "mlflow" / "k8s.yaml")
    deployment, service = objs[("Deployment", "mlflow")], objs[("Service", "mlflow")]
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    # RollingUpdate would start the new pod before the old one lets go of the RWO volume.
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    command = c["command"] + c.get("args", [])
    assert command[:4] == ["mlflow", "server", "--app-name", "basic-auth"] and "--artifacts-destination" in command
    env = env_of(c)
    check_mlflow_env(env, "k8s.yaml")
    for name in ("PGPASSWORD", "MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY"):
        assert "secretKeyRef" in env[name]["valueFrom"], name
    # the auth config: a mounted ConfigMap, holding no secret
    config_path = Path(env["MLFLOW_AUTH_CONFIG_PATH"]["value"])
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == str(config_path.parent)]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    config_map = objs[("ConfigMap", volume["configMap"]["name"])]
    check_auth_config(auth_ini(config_map["data"][config_path.name]), "k8s.yaml ConfigMap")
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"  # the one route basic-auth leaves open
    (pg,) = objs[("StatefulSet", "postgres")]["spec"]["template"]["spec"]["containers"]
    assert "secretKeyRef" in env_of(pg)["POSTGRES_PASSWORD"]["valueFrom"]


def selects(selector, labels):
    return selector.get("matchLabels", {}).items() <= labels.items() and not selector.get("matchExpressions")


def test_network_policies_admit_only_the_ray_pods_to_mlflow_and_only_mlflow_to_postgres():
    objs = k8s_objects(DEPLOY / "mlflow" / "k8s.yaml")
    labels = {
        name: objs[(k, name)]["spec"]["template"]["metadata"]["labels"]
        for k, name in (("Deployment", "mlflow"), ("StatefulSet", "postgres"))
    }
    labels["backup"] = objs[("CronJob", "postgres-backup")]["spec"]["jobTemplate"]["spec"]["template"]["metadata"][
        "labels"
    ]
    policies = [d for (k, _), d in objs.items() if k == "NetworkPolicy"]

    def peers_of(target):
        (policy,) = [p for p in policies if selects(p["spec"]["podSelector"], labels[target])]
        assert "Ingress" in policy["spec"]["policyTypes"]
        peers = [peer for rule in policy["spec"]["ingress"] for peer in rule["from"]]
        for peer in peers:
            assert "ipBlock" not in peer and peer.get("podSelector", {}).get("matchLabels"), (
                f"{target}: open peer {peer}"
            )
        return peers

    # MLflow: only pods labelled like the Ray pods (in namespaces labelled for it).
    ray_labels = [g["template"]["metadata"]["labels"] for _, spec in cluster_specs() for g in groups(spec)]
    for peer in peers_of("mlflow"):
        assert all(selects(peer["podSelector"], lab) for lab in ray_labels), peer
        assert not selects(peer["podSelector"], labels["postgres"]), peer
    # PostgreSQL: only MLflow and the backup job, from its own namespace.
    for peer in peers_of("postgres"):
        assert "namespaceSelector" not in peer
        assert selects(peer["podSelector"], labels["mlflow"]) or selects(peer["podSelector"], labels["backup"]), peer
        assert not any(selects(peer["podSelector"], lab) for lab in ray_labels), peer


def test_postgres_is_dumped_nightly_to_its_own_volume():
    objs = k8s_objects(DEPLOY / "mlflow" / "k8s.yaml")
    cron = objs[("CronJob", "postgres-backup")]
    assert cron["spec"]["schedule"] == "0 3 * * *" and cron["spec"]["concurrencyPolicy"] == "Forbid"
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert "pg_dump" in " ".join(c["command"])
    assert "secretKeyRef" in env_of(c)["PGPASSWORD"]["valueFrom"]
    (pg,) = objs[("StatefulSet", "postgres")]["spec"]["template"]["spec"]["containers"]
    assert c["image"] == pg["image"], "pg_dump must match the server's major version"
    (backups,) = [v for v in pod["volumes"] if any(m["name"] == v["name"] for m in c["volumeMounts"])]
    claim = backups["persistentVolumeClaim"]["claimName"]
    assert ("PersistentVolumeClaim", claim) in objs and claim != "mlflow-artifacts"


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


# ---------------------------------------------------------------- issue 24: the deploy defaults


def test_local_postgres_asks_for_passwords_and_mlflow_is_no_superuser():
    """local-server.sh: scram-sha-256 for every connection (no `trust`), MLflow's role owns its
    database and nothing else (a superuser could run programs with COPY ... TO PROGRAM), its
    password in a pgpass file, and the unauthenticated MLflow on loopback with a warning."""
    text = (DEPLOY / "mlflow" / "local-server.sh").read_text()
    lines = " ".join(_shell_lines(DEPLOY / "mlflow" / "local-server.sh"))
    assert "-A scram-sha-256" in lines and "--pwfile" in lines and "trust" not in lines
    assert "CREATE ROLE mlflow LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE" in text
    assert "CREATE DATABASE mlflow OWNER mlflow" in text and 'PGPASSFILE="$dir/pg/pgpass"' in lines
    assert "umask 077" in lines and "--host 127.0.0.1" in lines and "no authentication" in lines


def test_ray_pods_admit_only_ray_pods_and_mount_no_service_account_token():
    """Every KubeRay manifest: a NetworkPolicy over every Ray pod (and the RayJob's submitter)
    whose peers are Ray pods, or the KubeRay operator on the dashboard's port; no pod mounts a
    service account token but a head whose autoscaler scales through the Kubernetes API."""
    for path in (DEPLOY / "kuberay" / "raycluster.yaml", DEPLOY / "kuberay" / "rayjob.yaml"):
        documents = docs(path)
        (policy,) = [d for d in documents if d["kind"] == "NetworkPolicy"]
        (resource,) = [d for d in documents if d["kind"] in ("RayCluster", "RayJob")]
        spec = resource["spec"].get("rayClusterSpec", resource["spec"])
        pods = [(g["template"], g is spec["headGroupSpec"]) for g in groups(spec)]
        if "submitterPodTemplate" in resource["spec"]:
            pods.append((resource["spec"]["submitterPodTemplate"], False))
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        for template, is_head in pods:
            assert selects(policy["spec"]["podSelector"], template["metadata"]["labels"]), path
            needs_api = is_head and spec.get("enableInTreeAutoscaling")
            assert template["spec"].get("automountServiceAccountToken") is (None if needs_api else False), (
                path,
                is_head,
            )
        for rule in policy["spec"]["ingress"]:
            for peer in rule["from"]:
                assert "ipBlock" not in peer and peer["podSelector"]["matchLabels"], peer
                if "namespaceSelector" in peer:  # another namespace: the operator, on the dashboard only
                    assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "kuberay-operator"}
                    assert rule["ports"] == [{"protocol": "TCP", "port": 8265}]
                else:
                    assert all(selects(peer["podSelector"], t["metadata"]["labels"]) for t, _ in pods)


def test_mlflow_users_read_by_default():
    """default_permission READ: no user rewrites another's runs (the config.yaml export trusts)."""
    configs = [(DEPLOY / "mlflow" / "basic_auth.ini").read_text()]
    (config_map,) = [d for d in docs(DEPLOY / "mlflow" / "k8s.yaml") if d["kind"] == "ConfigMap"]
    configs.append(config_map["data"]["basic_auth.ini"])
    for text in configs:
        assert auth_ini(text)["default_permission"] == "READ"
    assert "experiments/permissions/create" in (DEPLOY / "mlflow" / "README.md").read_text()
