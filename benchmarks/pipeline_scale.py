"""How cost grows with the data (issue #47): train, link and build at several sizes; print JSON.

Every stage runs the real CLI (``python -m cli``) in a child process whose whole process tree
(Ray, Beam or Dask included) is polled every ``--poll-s`` for its resident memory, so the
figures are the command's own. Corpora come from ``mmlinks data synth-features`` (one per size,
reused when ``--workdir`` / ``--data-root`` holds it).
- ``train``: ``mmlinks train --workers W --epochs E``: seconds per epoch and documents/s of the
  last epoch (from the run's MLflow metrics), test AUC, peak RSS of the driver, each Ray worker
  and Ray's system processes, the object store's peak (/dev/shm).
- ``link``: ``mmlinks link`` on Direct and Dask: documents/s (start-up included) and peak RSS.
- ``build``: ``data synth`` + ``data build`` at ``--build-sizes`` per runner: the median wall of
  ``--build-repeats`` cold builds, peak RSS, images inferred; ``--build-warm`` once more on the
  first build's image store. Issue #61 folded ``build_scale.py`` and ``dask_build.py`` in here
  and retired ``--read-sizes`` / ``--read-code`` (docs/benchmarks-scale.md).
Ratios against the smallest size come with each stage.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
RUNNERS = {"direct": ["--runner", "DirectRunner"], "dask": ["--runner", "dask"]}


def role(proc: psutil.Process, top: int) -> str | None:
    """A process's part in the run, from its command line (Ray names its workers ``ray::...``);
    None when the command line cannot be read (an exiting process: its last role stands)."""
    if proc.pid == top:
        return "driver"
    try:
        cmd = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    if not cmd:  # a zombie's command line is empty
        return None
    exe = cmd.split(" ", 1)[0]
    if exe.endswith(("/raylet", "/gcs_server")):
        return exe.rsplit("/", 1)[1]
    for key, name in (
        ("RayTrainWorker", "train_worker"),
        ("ray::", "ray_task"),
        ("default_worker.py", "ray_task"),
        ("dask", "dask"),
        ("distributed", "dask"),
        ("beam", "beam_worker"),
    ):
        if key in cmd:
            return name
    return "other"


class TreeMonitor:
    """Peak RSS of every process in a process tree, polled on a thread; and /dev/shm's growth."""

    def __init__(self, pid: int, poll_s: float):
        self.pid, self.poll_s = pid, poll_s
        self.peaks: dict[int, tuple[str, int]] = {}  # pid -> (role, peak rss)
        self.private: dict[int, int] = {}  # pid -> peak of rss less shared pages (object store, libraries)
        self.cpu: dict[int, float] = {}  # pid -> CPU seconds at its last poll (robust to a loaded machine)
        self.shm0 = _shm_used()
        self.shm_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            top = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._stop.is_set():
            try:
                procs = [top, *top.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            for p in procs:
                try:
                    info = p.memory_info()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                rss = info.rss
                with contextlib.suppress(psutil.Error):
                    t = p.cpu_times()
                    self.cpu[p.pid] = t.user + t.system  # a reaped child's is its own entry
                self.private[p.pid] = max(self.private.get(p.pid, 0), rss - info.shared)
                known = self.peaks.get(p.pid)
                # a Ray worker starts as default_worker.py (--raylet-name=...) and takes its ray::
                # title later: its role is decided again until it is a training worker
                # (before #47's 100K run an exiting worker fell to "other" with its peak)
                name = known[0] if known and known[0] == "train_worker" else role(p, self.pid)
                name = name or (known[0] if known else "other")
                self.peaks[p.pid] = (name, max(rss, known[1] if known else 0))
            self.shm_peak = max(self.shm_peak, _shm_used() - self.shm0)
            self._stop.wait(self.poll_s)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        by_role: dict[str, list[int]] = {}
        private: dict[str, list[int]] = {}
        cpu: dict[str, float] = {}
        for pid, (name, rss) in self.peaks.items():
            by_role.setdefault(name, []).append(rss)
            private.setdefault(name, []).append(self.private.get(pid, 0))
            cpu[name] = cpu.get(name, 0.0) + self.cpu.get(pid, 0.0)
        mib = lambda b: round(b / 2**20)
        desc = lambda d: {k: sorted((mib(v) for v in vs), reverse=True) for k, vs in sorted(d.items())}
        return {
            "peak_rss_mib": desc(by_role),
            "peak_private_mib": desc(private),
            "peak_shm_growth_mib": mib(self.shm_peak),
            "cpu_s": {k: round(v, 1) for k, v in sorted(cpu.items())},
            "cpu_s_total": round(sum(cpu.values()), 1),
        }


def _shm_used() -> int:
    try:
        return shutil.disk_usage("/dev/shm").used
    except OSError:
        return 0


# Ray gives its raylet 30 s to register (hard-coded); on a machine loaded far beyond its cores
# that start-up alone can fail, before any of the work measured here has begun.
RAY_START_TIMEOUT = "timed out during startup"


def run_cli(args: list[str], poll_s: float, tries: int = 2) -> tuple[dict, float, dict]:
    """``run_once``, again (at most ``tries`` times) when Ray's node failed to start."""
    for attempt in range(tries):
        res, wall, mem = run_once(args, poll_s, child_env())
        if RAY_START_TIMEOUT not in res.get("error", ""):
            return ({**res, "ray_start_retries": attempt} if attempt else res), wall, mem
    return res, wall, mem


def child_env() -> dict:
    """The commands' environment. Ray starts its workers ``RAY_worker_niceness`` (default 15)
    nicer than the driver: on a machine shared with other jobs the training workers then get a
    fraction of a core each (measured: 13 % each at a load of 40 on 2 cores, no epoch of 8,000
    documents in 10 minutes), so a run would measure the neighbours. Same priority as the driver
    unless the caller set it."""
    return {"RAY_worker_niceness": "0", **os.environ}


def run_once(args: list[str], poll_s: float, env: dict) -> tuple[dict, float, dict]:
    """``python -m cli ARGS --json`` in a child process: (its JSON, wall seconds, memory)."""
    cmd = [sys.executable, "-m", "cli", *args, "--json"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    mon = TreeMonitor(proc.pid, poll_s)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    mem = mon.stop()
    if proc.returncode != 0:
        sys.stderr.write(f"$ {' '.join(cmd)}\n{err[-4000:]}\n")
        return {"error": (err.strip().splitlines() or ["?"])[-1]}, wall, mem
    lines = [ln for ln in out.splitlines() if ln.strip().startswith("{")]
    return json.loads(lines[-1]) if lines else {}, wall, mem


def corpus(work: Path, size: int, args) -> tuple[Path, float]:
    """The feature-level dataset of ``size`` documents (made once; reused when present)."""
    root = Path(args.data_root) if args.data_root else work / "data"
    out = root / f"features-{size}"
    if (out / "manifest.json").exists():
        return out, 0.0
    shutil.rmtree(out, ignore_errors=True)
    val = test = max(2, size // 10)  # size = all documents: 80 / 10 / 10
    cmd = ["data", "synth-features", "--out", str(out), "--docs", str(size - val - test)]
    cmd += ["--val-docs", str(val), "--test-docs", str(test), "--seed", str(args.seed), *args.synth_arg]
    res, wall, _ = run_cli(cmd, args.poll_s)
    if "error" in res:
        raise SystemExit(f"synth-features failed: {res['error']}")
    return out, wall


def train_metrics(tracking_uri: str, run_id: str) -> dict:
    """Per-epoch training time, documents/s and the wall between epochs, from MLflow."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    hist = {k: client.get_metric_history(run_id, k) for k in ("docs_per_s", "val_loss", "epoch_start_s")}
    dps = [m.value for m in sorted(hist["docs_per_s"], key=lambda m: m.step)]
    stamps = [m.timestamp / 1000 for m in sorted(hist["val_loss"], key=lambda m: m.step)]
    walls = [round(b - a, 1) for a, b in itertools.pairwise(stamps)]
    return {
        "docs_per_s_per_epoch": [round(x, 1) for x in dps],
        "epoch_start_s": [round(m.value, 2) for m in sorted(hist["epoch_start_s"], key=lambda m: m.step)],
        "epoch_wall_s": walls,
    }


def train_point(data: Path, size: int, work: Path, args) -> dict:
    manifest = json.loads((data / "manifest.json").read_text())
    n_train = manifest["counts"]["splits"].get("train", size)
    wd = work / f"train-{size}"
    shutil.rmtree(wd, ignore_errors=True)
    cmd = ["train", "--data", str(data), "--workdir", str(wd), "--epochs", str(args.epochs)]
    cmd += ["--workers", str(args.workers), "--seed", str(args.seed), *args.train_arg]
    res, wall, mem = run_cli(cmd, args.poll_s)
    out = {"command": "mmlinks " + " ".join(cmd), "wall_s": round(wall, 1), **mem, "train_docs": n_train}
    out["ray_start_retries"] = res.get("ray_start_retries", 0)
    if "error" in res:
        return {**out, "error": res["error"]}
    m = train_metrics(res["tracking_uri"], res["run_id"])
    last = m["docs_per_s_per_epoch"][-1] if m["docs_per_s_per_epoch"] else None
    return {
        **out,
        **m,
        "docs_per_s": last,
        "train_s_per_epoch": round(n_train / last, 1) if last else None,
        "test_auc": (res.get("test") or {}).get("auc"),
        "random_auc": (res.get("random") or {}).get("auc"),
        "model_uri": res["model_uri"],
        "tracking_uri": res["tracking_uri"],
        "workdir": str(wd),
    }


def link_point(data: Path, size: int, work: Path, trained: dict, runner: str, args) -> dict:
    """``trained``: the ``train_point`` whose registered model links."""
    out_dir = work / f"links-{size}-{runner}"
    shutil.rmtree(out_dir, ignore_errors=True)
    cmd = ["link", "--model", trained["model_uri"], "--data", str(data), "--out", str(out_dir)]
    cmd += ["--workdir", trained["workdir"], *RUNNERS[runner]]
    res, wall, mem = run_cli(cmd, args.poll_s)
    out = {"command": "mmlinks " + " ".join(cmd), "wall_s": round(wall, 1), **mem}
    if "error" in res:
        return {**out, "error": res["error"]}
    shutil.rmtree(out_dir, ignore_errors=True)  # the links are not needed, only their cost
    return {**out, "documents": res["documents_linked"], "docs_per_s": res["docs_per_s"]}


def build_point(size: int, work: Path, runner: str, args) -> dict:
    raw = work / f"raw-{size}"
    if not raw.exists():
        synth = ["data", "synth", "--out", str(raw), "--docs", str(size), "--seed", str(args.seed), "--quiet"]
        synth += args.build_synth_arg
        res, _, _ = run_cli(synth, args.poll_s)
        if "error" in res:
            return {"error": res["error"]}
    out_dir = work / f"build-{size}-{runner}"
    cmd = ["data", "build", "--input", str(raw), *RUNNERS[runner], *args.build_arg]
    walls, versions = [], set()
    for _ in range(max(1, args.build_repeats)):
        shutil.rmtree(out_dir, ignore_errors=True)
        res, wall, mem = run_cli([*cmd, "--out", str(out_dir)], args.poll_s)
        out = {"command": "mmlinks " + " ".join([*cmd, "--out", str(out_dir)]), **mem}
        if "error" in res:
            shutil.rmtree(out_dir, ignore_errors=True)
            return {**out, "wall_s": round(wall, 1), "error": res["error"]}
        walls.append(round(wall, 1))
        versions.add(res.get("dataset_version"))
    out["wall_s"], out["walls_s"] = sorted(walls)[len(walls) // 2], walls
    out["documents"] = sum(res.get("splits", {}).values()) or None
    out["images_inferred"] = (res.get("build") or {}).get("features_computed")
    if args.build_warm:  # the same build again, sharing the image store: nothing fetched or inferred
        warm_dir = work / f"build-{size}-{runner}-warm"
        shutil.rmtree(warm_dir, ignore_errors=True)
        store = ["--image-store", str(out_dir / "image-store")]
        warm, warm_s, _ = run_cli([*cmd, "--out", str(warm_dir), *store], args.poll_s)
        shutil.rmtree(warm_dir, ignore_errors=True)
        out["warm_wall_s"] = round(warm_s, 1) if "error" not in warm else warm["error"]
        versions.add(warm.get("dataset_version"))
    out["same_dataset_version"] = len(versions) == 1
    shutil.rmtree(out_dir, ignore_errors=True)
    return out


def ratios(points: dict, key: str) -> dict:
    """Each size's ``key`` over the smallest size's."""
    sizes = sorted(int(s) for s in points if points[s].get(key))
    if not sizes:
        return {}
    base = points[str(sizes[0])][key]
    return {str(s): round(points[str(s)][key] / base, 3) for s in sizes[1:]}


def rss_ratios(points: dict, key: str = "peak_rss_mib") -> dict:
    """Each size's peak memory per role (the largest process of the role) over the smallest's."""
    sizes = sorted(int(s) for s in points if key in points[s] and "error" not in points[s])
    if not sizes:
        return {}
    base = points[str(sizes[0])][key]
    out = {}
    for s in sizes[1:]:
        cur = points[str(s)][key]
        out[str(s)] = {r: round(cur[r][0] / base[r][0], 3) for r in cur if r in base and base[r][0]}
    return out


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-sizes", default="10000", help="documents per training corpus, comma-separated")
    ap.add_argument(
        "--link-sizes",
        default="10000",
        help="documents per linked corpus; the model is the one trained at the first train size",
    )
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2, help="Ray Train workers")
    ap.add_argument("--train-arg", action="append", default=[], help="extra `mmlinks train` argument")
    ap.add_argument("--runners", default="direct,dask", help="link and build runners")
    ap.add_argument("--build-sizes", default="", help="image builds (e.g. 1000,5000,20000); none by default")
    ap.add_argument(
        "--build-synth-arg",
        action="append",
        default=[],
        help="extra `data synth` argument for the build's raw corpora (e.g. --images-max=2)",
    )
    ap.add_argument("--build-arg", action="append", default=[], help="extra `data build` argument")
    ap.add_argument("--build-repeats", type=int, default=1, help="cold builds per size and runner (median)")
    ap.add_argument("--build-warm", action="store_true", help="build again sharing the image store")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--poll-s", type=float, default=0.5, help="process tree polling interval")
    ap.add_argument("--workdir", default="")
    ap.add_argument("--data-root", default="", help="folder of existing features-<size> corpora")
    ap.add_argument("--synth-arg", action="append", default=[], help="extra `data synth-features` argument")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="mmlinks-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    runners = [r for r in args.runners.split(",") if r]
    sizes = lambda text: [int(x) for x in text.split(",") if x]
    report: dict = {"cpus": os.cpu_count(), "load_before": load(), "train": {}, "link": {}, "build": {}}
    model = None
    for size in sizes(args.train_sizes):
        data, gen_s = corpus(work, size, args)
        report.setdefault("generate_s", {})[str(size)] = round(gen_s, 1)
        trained = train_point(data, size, work, args)
        report["train"][str(size)] = trained
        print(json.dumps({"train": size, **trained}), file=sys.stderr)
        model = model or (trained if "model_uri" in trained else None)
    for size in sizes(args.link_sizes) if model else []:
        data, gen_s = corpus(work, size, args)
        report.setdefault("generate_s", {})[str(size)] = round(gen_s, 1)
        for runner in runners:
            point = link_point(data, size, work, model, runner, args)
            report["link"].setdefault(runner, {})[str(size)] = point
            print(json.dumps({"link": size, "runner": runner, **point}), file=sys.stderr)
    for size in sizes(args.build_sizes):
        for runner in runners:
            point = build_point(size, work, runner, args)
            report["build"].setdefault(runner, {})[str(size)] = point
            print(json.dumps({"build": size, "runner": runner, **point}), file=sys.stderr)
    report["ratios"] = {
        "train_s_per_epoch": ratios(report["train"], "train_s_per_epoch"),
        "train_docs_per_s": ratios(report["train"], "docs_per_s"),
        "train_cpu_s": ratios(report["train"], "cpu_s_total"),
        "train_peak_rss": rss_ratios(report["train"]),
        "train_peak_private": rss_ratios(report["train"], "peak_private_mib"),
        "link_docs_per_s": {r: ratios(p, "docs_per_s") for r, p in report["link"].items()},
        "link_peak_rss": {r: rss_ratios(p) for r, p in report["link"].items()},
        "link_peak_private": {r: rss_ratios(p, "peak_private_mib") for r, p in report["link"].items()},
        "build_wall": {r: ratios(p, "wall_s") for r, p in report["build"].items()},
    }
    direct, dask = report["build"].get("direct", {}), report["build"].get("dask", {})
    report["ratios"]["build_dask_speed_vs_direct"] = {
        s: round(direct[s]["wall_s"] / dask[s]["wall_s"], 3)
        for s in direct
        if s in dask and "error" not in direct[s] and "error" not in dask[s]
    }
    report["load_after"] = load()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
