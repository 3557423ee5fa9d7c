"""The dataset build on a real dask.distributed cluster (a scheduler and two worker processes)
through ``--runner dask`` (issue #35): the same bytes as the DirectRunner's build, counters that
feed the manifest, and one-line errors for a scheduler that cannot be reached."""

from __future__ import annotations

import hashlib
import pickle
import time
from pathlib import Path

import apache_beam as beam
import pytest

from pipelines.build import build_dataset, scheduler_unreachable, worker_lost
from pipelines.build_config import BuildConfig
from pipelines.dask_tasks import stable_hash
from pipelines.local_cluster import runner_cluster
from pipelines.runners import DASK_RUNNER_PATH, pipeline_options
from schemas.errors import MmlinksError
from schemas.manifest import MANIFEST_NAME, Manifest


def version_files(out: Path) -> dict[str, str]:
    """Every committed file of ``out``'s current version (shards, dead letter), by digest."""
    vdir = out / "versions" / Manifest.read(out).dataset_version
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(vdir.iterdir())}


@pytest.mark.slow
def test_the_build_on_two_dask_workers_gives_the_direct_runners_bytes(
    corpus, dataset, dask_cluster, tmp_path
):
    """``dataset`` is the suite's DirectRunner build of ``corpus``; the same build on the Dask
    cluster (thread count as recorded there) commits the same manifest, shards and dead letter."""
    reference = Manifest.read(dataset)
    out = tmp_path / "dask"
    cfg = BuildConfig(
        source="synthetic",
        input=str(corpus),
        out=str(out),
        split_ratios={"train": 0.6, "val": 0.2, "test": 0.2},
        runner="dask",
        dask_address=dask_cluster,
        cpu_threads=reference.build_params["cpu_threads"],
    )
    m = build_dataset(cfg)
    assert (out / MANIFEST_NAME).read_bytes() == (dataset / MANIFEST_NAME).read_bytes()
    assert version_files(out) == version_files(dataset)
    # the counts come from the Dask workers' counters: every input line kept or dead-lettered
    lines = len((corpus / "documents.jsonl").read_bytes().splitlines())
    dropped = m.counts["dropped"]
    assert m.counts["pipeline"]["lines_in"] == lines
    kept = sum(m.counts["splits"].values())
    assert kept + sum(v for k, v in dropped.items() if k.startswith(("document:", "line:"))) == lines


@pytest.mark.slow
def test_the_readmes_dask_command_builds_the_direct_runners_bytes(corpus, dataset, tmp_path):
    """``mmlinks data build ... --runner dask --dask-workers 2`` as a user runs it: the command
    starts its workers' fork server early and its own local cluster, and commits the bytes of
    the DirectRunner's build."""
    import json
    import subprocess
    import sys

    from tests.conftest import venv_env

    reference = Manifest.read(dataset)
    out = tmp_path / "dask-cli"
    cmd = [sys.executable, "-m", "cli", "data", "build", "--source", "synthetic", "--input", str(corpus)]
    cmd += ["--out", str(out), "--split", "0.6,0.2,0.2", "--runner", "dask", "--dask-workers", "2"]
    cmd += ["--cpu-threads", str(reference.build_params["cpu_threads"]), "--json"]
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(cmd, cwd=root, env=venv_env(PYTHONPATH=str(root)), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["dataset_version"] == reference.dataset_version
    assert version_files(out) == version_files(dataset)


def test_only_a_dask_job_on_a_local_cluster_prestarts_its_workers(monkeypatch):
    from pipelines import local_cluster

    started = []
    monkeypatch.setattr(local_cluster, "_forkserver_started", [False])
    monkeypatch.setattr("multiprocessing.forkserver.ensure_running", lambda: started.append(True))
    assert not local_cluster.prestart_local_workers("DirectRunner", None, "pipelines.build")
    assert not local_cluster.prestart_local_workers("my.own.Runner", None, "pipelines.build")  # no error
    assert not local_cluster.prestart_local_workers("dask", "tcp://scheduler:8786", "pipelines.build")
    assert local_cluster.prestart_local_workers("dask", None, "pipelines.build")
    assert not local_cluster.prestart_local_workers("dask", None, "pipelines.build")  # once a process
    assert started == [True]


@pytest.mark.slow
def test_tagged_outputs_side_inputs_finish_bundle_and_counters_on_dask(dask_cluster, tmp_path):
    """The translation's parts that Beam's own DaskRunner gets wrong, in one small graph."""

    class Split(beam.DoFn):
        def process(self, x, total):
            beam.metrics.Metrics.counter("t", "seen").inc()
            if x % 2:
                yield beam.pvalue.TaggedOutput("odd", (x, total))
            else:
                yield x

    class CountBundle(beam.DoFn):
        def start_bundle(self):
            self.n = 0

        def process(self, kv):
            self.n += len(kv[1])

        def finish_bundle(self):
            yield beam.transforms.window.GlobalWindows.windowed_value(self.n)

    def write(pcoll, name):
        return (
            pcoll
            | f"Str{name}" >> beam.Map(str)
            | f"Write{name}"
            >> beam.io.WriteToText(str(tmp_path / name), shard_name_template="", num_shards=1)
        )

    options = pipeline_options("dask", dask_address=dask_cluster)
    with beam.Pipeline(options=options) as p:
        xs = p | beam.Create(list(range(20)))
        total = beam.pvalue.AsSingleton(xs | "Total" >> beam.CombineGlobally(sum))
        parts = xs | beam.ParDo(Split(), total).with_outputs("odd", main="even")
        write(parts.even, "even")
        write(parts.odd, "odd")
        counted = parts.even | beam.Map(lambda x: (x % 3, x)) | beam.GroupByKey() | beam.ParDo(CountBundle())
        write(counted | "SumCounts" >> beam.CombineGlobally(sum), "grouped")
    lines = {n: sorted((tmp_path / n).read_text().split()) for n in ("even", "odd", "grouped")}
    assert lines["even"] == sorted(str(x) for x in range(0, 20, 2))
    assert sorted(eval(x) for x in (tmp_path / "odd").read_text().splitlines()) == [
        (x, 190) for x in range(1, 20, 2)
    ]
    assert lines["grouped"] == ["10"]  # every even number counted once, in finish_bundle
    seen = p.result.metrics().query(beam.metrics.MetricsFilter().with_name("seen"))["counters"]
    assert [c.committed for c in seen] == [20]


def test_the_dask_runner_is_beams_with_this_projects_translation():
    from apache_beam.runners.dask.dask_runner import DaskRunner as BeamDaskRunner

    from pipelines.dask_runner import DaskRunner

    assert issubclass(DaskRunner, BeamDaskRunner)
    assert DASK_RUNNER_PATH == f"{DaskRunner.__module__}.{DaskRunner.__name__}"
    opts = pipeline_options("dask", dask_address="tcp://127.0.0.1:8786").get_all_options()
    assert opts["runner"] == DASK_RUNNER_PATH and opts["address"] == "tcp://127.0.0.1:8786"
    with pytest.raises(MmlinksError, match="go with --runner dask"):
        BuildConfig(source="synthetic", input="x", out="y", dask_workers=2).workers()
    with pytest.raises(MmlinksError, match="dask_address"):
        BuildConfig(source="synthetic", input="x", out="y", runner="dask", dask_address="not an address")
    assert BuildConfig(source="synthetic", input="x", out="y", runner="dask", dask_workers=3).workers() == 3


def test_keys_hash_the_same_in_every_process():
    """GroupByKey's partition of a key must not depend on the worker's str hash salt."""
    import subprocess
    import sys

    keys = ["doc-1", ("train", 3), None, "small"]
    code = f"from pipelines.dask_tasks import stable_hash; print([stable_hash(k) for k in {keys!r}])"
    root = Path(__file__).resolve().parents[2]
    runs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            cwd=root,
            env={"PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert runs == {f"{[stable_hash(k) for k in keys]}\n"}


def test_an_unreachable_scheduler_fails_the_build_in_one_line(corpus, tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = BuildConfig(
        source="synthetic",
        input=str(corpus),
        out=str(tmp_path / "out"),
        runner="dask",
        dask_address=f"tcp://127.0.0.1:{port}",
        beam_args=["--dask_connection_timeout=2"],
    )
    t0 = time.monotonic()
    with pytest.raises(MmlinksError) as err:
        build_dataset(cfg)
    assert time.monotonic() - t0 < 120
    line = str(err.value)
    assert "\n" not in line and line.startswith("the Dask scheduler cannot be reached")
    assert f"127.0.0.1:{port}" in line and "nothing was committed" in line
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()


def test_dask_wording_for_a_lost_worker_and_scheduler_is_recognised():
    from distributed.scheduler import KilledWorker

    class Worker:
        address = "tcp://127.0.0.1:4242"

    try:
        try:
            raise KilledWorker("('_run_bundle-abc', 3)", Worker(), 2)
        except KilledWorker as inner:
            raise RuntimeError("the pipeline failed") from inner
    except RuntimeError as outer:
        lost = worker_lost(outer)
    assert lost == "KilledWorker: on 3 different workers, but all those workers died"
    assert scheduler_unreachable(OSError("Timed out trying to connect to tcp://h:8786 after 2 s")) == (
        "OSError: Timed out trying to connect to tcp://h:8786 after 2 s"
    )
    assert scheduler_unreachable(RuntimeError("bad input")) is None
    assert worker_lost(OSError("Timed out trying to connect to tcp://h:8786 after 2 s")) is None


def test_a_local_cluster_is_started_for_the_job_and_stopped_after_it():
    from dask.distributed import Client

    options = pipeline_options("dask")
    with runner_cluster(options, 1) as opts:
        address = opts.get_all_options()["address"]
        with Client(address, timeout=30) as client:
            assert len(client.nthreads()) == 1
            # no dashboard, so no profiler or disk monitor in its workers (LOCAL_CLUSTER_CONFIG):
            # with them, a 0.5 s task left 50 profile samples
            client.submit(time.sleep, 0.5).result()
            seen = client.run(
                lambda dask_worker: (
                    dask_worker.profile_recent,
                    list(dask_worker.monitor.quantities),
                    dask_worker.periodic_callbacks["monitor"].callback_time,
                )
            )
            ((recent, watched, monitor_ms),) = seen.values()
            assert recent.get("count", 0) == 0
            assert "host_disk_io.read_bps" not in watched and "cpu" in watched
            assert monitor_ms == 2000  # the system monitor wakes every 2 s, not 0.5
    assert opts.get_all_options()["address"] is None
    with pytest.raises(OSError):
        Client(address, timeout=2)
    assert stable_hash("x") == stable_hash("x")


@pytest.mark.slow
def test_a_dofn_is_set_up_once_per_worker_process_not_per_bundle(dask_cluster):
    """What lets RunInference load its model once per worker (with Beam's Shared handle): the
    DoFn instance and its ``setup`` live as long as the worker process, across bundles."""

    class Setups(beam.DoFn):
        def setup(self):
            beam.metrics.Metrics.counter("t", "setups").inc()

        def process(self, x):
            beam.metrics.Metrics.counter("t", "elements").inc()
            yield x

    options = pipeline_options("dask", ["--dask_npartitions=12"], dask_address=dask_cluster)
    with beam.Pipeline(options=options) as p:
        _ = p | beam.Create(list(range(48))) | beam.ParDo(Setups())
    got = {
        c.key.metric.name: c.committed
        for c in p.result.metrics().query(beam.metrics.MetricsFilter().with_namespace("t"))["counters"]
    }
    assert got["elements"] == 48
    assert 1 <= got["setups"] <= 2  # two worker processes, twelve bundles


def test_joins_and_side_inputs_keep_the_graph_linear_in_partitions():
    """A GroupByKey over a bag whose partitions a Flatten added up is narrowed to the cluster's
    count first (a task shuffle grows with the input's partitions: an 8-document build's graph had
    109,196 tasks before), and a side input is one task over the partitions, in their order.
    No cluster: the graphs are counted and computed with dask's synchronous scheduler."""
    import dask
    import dask.bag as db

    from pipelines.dask_runner import _group_by_key, _materialized, _Parts

    wide = db.concat([db.from_sequence([(i % 5, i) for i in range(k, 400, 40)]) for k in range(40)])
    n = wide.npartitions
    assert n >= 40
    grouped = _group_by_key(_Parts.of(wide), partitions=4)
    assert grouped.npartitions == 4
    added = len(dict(grouped.__dask_graph__())) - len(dict(wide.__dask_graph__()))
    assert added < 64  # narrowed first: a shuffle of 4 into 4, whatever n; unnarrowed here: 410
    with dask.config.set(scheduler="sync"):
        groups = dict(grouped.compute())
        assert {k: sorted(v) for k, v in groups.items()} == {
            k: [i for i in range(400) if i % 5 == k] for k in range(5)
        }
        side = _materialized(_Parts.of(db.from_sequence(range(100), npartitions=7)))
        assert len(dict(side.__dask_graph__())) == 7 + 1  # the partitions and one task over them
        assert side.compute() == list(range(100))


def test_one_reader_chains_of_pardos_run_fused_in_one_task_named_by_their_labels(new_pipeline):
    """``Double it`` -> ``Keep/Odd`` (each output read by the next only) is one task per partition,
    named by both labels; a PCollection read twice ends a chain. The outputs and counters are the
    unfused ones. No cluster: translated, then computed with dask's synchronous scheduler."""
    import dask
    from apache_beam.runners.dask.overrides import dask_overrides
    from dask.utils import key_split

    from pipelines.dask_runner import _Translator, consumers, task_name
    from pipelines.dask_tasks import _sum_counters

    def counted(x):
        beam.metrics.Metrics.counter("t", "seen").inc()
        return x

    p = new_pipeline()
    doubled = p | beam.Create(list(range(10))) | "Double it" >> beam.Map(lambda x: 2 * counted(x))
    kept = doubled | "Keep/Big" >> beam.Filter(lambda x: x > 6) | "Then" >> beam.Map(lambda x: x + 1)
    halves = doubled | "Halve" >> beam.Map(lambda x: x // 2)
    p.replace_all(dask_overrides())
    translator = _Translator(partitions=2, readers=consumers(p))
    p.visit(translator)
    everything = translator.everything()
    prefixes = {key_split(k) for k in dict(everything.__dask_graph__())}
    assert {"Double_it", "Keep+Then", "Halve"} <= prefixes, prefixes  # doubled has two readers
    with dask.config.set(scheduler="sync"):
        assert sorted(translator.bag(kept).compute()) == [9, 11, 13, 15, 17, 19]
        assert sorted(translator.bag(halves).compute()) == list(range(10))
        counters = _sum_counters(everything.compute())
    assert counters == {("Double it", "t", "seen"): 10}
    assert task_name("CNN/BeamML RunInference/ParDo(x)") == "CNN/BeamML_RunInference/ParDo(x)"


def test_a_fused_stage_streams_each_element_through_its_members(new_pipeline):
    """A fused chain runs element by element, as a Beam SDK worker runs fused steps: ``Inflate``'s
    1 MB output per element is read by ``Shrink`` before the next element is inflated, so one task
    over 200 elements holds about one megabyte in flight, not 200 (run member after member over
    the whole partition, it held every member's output list: a 20,000-document build's Dask
    worker reached 6.7 GB). ``finish_bundle`` outputs still reach the reader before it finishes.
    No cluster: one partition, computed with dask's synchronous scheduler, peak traced."""
    import tracemalloc

    import dask
    from apache_beam.runners.dask.overrides import dask_overrides

    from pipelines.dask_runner import _Translator, consumers

    class Inflate(beam.DoFn):
        def process(self, x):
            yield x, bytes(1 << 20)

        def finish_bundle(self):
            yield beam.transforms.window.GlobalWindows.windowed_value((-1, b"last"))

    class Shrink(beam.DoFn):
        def start_bundle(self):
            self.seen = 0

        def process(self, kv):
            self.seen += 1
            yield kv[0], len(kv[1])

        def finish_bundle(self):
            yield beam.transforms.window.GlobalWindows.windowed_value(("seen", self.seen))

    p = new_pipeline()
    shrunk = (
        p
        | beam.Create(list(range(200)))
        | "Inflate" >> beam.ParDo(Inflate())
        | "Shrink" >> beam.ParDo(Shrink())
    )
    p.replace_all(dask_overrides())
    translator = _Translator(partitions=1, readers=consumers(p))
    p.visit(translator)
    bag = translator.bag(shrunk)
    tracemalloc.start()
    try:
        with dask.config.set(scheduler="sync"):
            got = bag.compute()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sorted(got, key=str) == sorted(
        [(x, 1 << 20) for x in range(200)] + [(-1, 4), ("seen", 201)], key=str
    )
    assert peak < 40 << 20, f"{peak >> 20} MiB traced at peak"  # member after member: > 200 MiB


def test_a_reads_partitions_and_its_groupings_grow_with_the_input(tmp_path, monkeypatch, new_pipeline):
    """A Read is cut into bundles of at most READ_BUNDLE_BYTES and a GroupByKey after it keeps
    that many partitions (up to MAX_PARTITIONS_PER_SLOT a slot), so a task's partition stays
    small as the corpus grows (cut into twice the task slots whatever the size, a 20,000-document
    build gave each task a quarter of the corpus, the last one run alone). The values are the
    same either way. No cluster: dask's synchronous scheduler."""
    import dask
    from apache_beam.runners.dask.overrides import dask_overrides

    from pipelines import dask_runner
    from pipelines.dask_runner import MAX_PARTITIONS_PER_SLOT, _Translator, consumers

    READ_BUNDLE_BYTES = 256 << 10  # a small corpus stands for a big one: smaller bundles
    monkeypatch.setattr(dask_runner, "READ_BUNDLE_BYTES", READ_BUNDLE_BYTES)
    lines = [f"{i % 7} {'x' * 90}" for i in range(50_000)]  # ~4.4 MiB
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    wanted = -(-(tmp_path / "in.txt").stat().st_size // READ_BUNDLE_BYTES)

    def translated(slots: int):
        p = new_pipeline()
        read = p | beam.io.ReadFromText(str(tmp_path / "in.txt"))
        keyed = read | beam.Map(lambda line: (line.split()[0], line))
        grouped = keyed | beam.GroupByKey() | "Sorted" >> beam.MapTuple(lambda k, v: (k, sorted(v)))
        copied = keyed | "Copy" >> beam.Map(lambda kv: kv[1])  # keyed has two readers: a bag
        p.replace_all(dask_overrides())
        translator = _Translator(partitions=2 * slots, readers=consumers(p))
        p.visit(translator)
        return [translator.bag(pc) for pc in (keyed, grouped, copied)]

    keyed, grouped, copied = translated(slots=2)
    assert keyed.npartitions >= wanted >= 16  # twice the 2 slots before: 4
    assert grouped.npartitions == keyed.npartitions
    with dask.config.set(scheduler="sync"):
        assert sorted(copied.compute()) == sorted(lines)
        assert dict(grouped.compute()) == {
            str(k): sorted(x for x in lines if x.startswith(f"{k} ")) for k in range(7)
        }
    keyed, grouped, _ = translated(slots=1)  # a grouping stops at its cap, a read does not
    assert grouped.npartitions == MAX_PARTITIONS_PER_SLOT < wanted <= keyed.npartitions


def test_reading_a_stages_output_or_a_flatten_costs_no_task_of_its_own(dask_cluster, new_pipeline):
    """What reads a fused stage's tagged output selects its tag itself, a Flatten is only a list
    of its inputs' partitions and a grouping runs its own shuffle (N + N x M + M tasks), so a
    graph of two tagged outputs, a Flatten and a GroupByKey holds the stages' tasks, the
    grouping's and one counters task per stage partition, no more (Beam's labels plus Dask's
    select, concat, repartition and task shuffle: 1,697 tasks for a 1,000-document build, 781
    after). Where a task joins several partitions, each tagged one is selected next to it first,
    so no whole fused partition moves for one tag. The translation's own tasks run first on a
    worker (Dask priority, read back from a real scheduler); the values are the unfused ones."""
    import collections

    import dask
    from apache_beam.runners.dask.overrides import dask_overrides
    from dask.distributed import Client
    from dask.utils import key_split

    from pipelines.dask_runner import PLUMBING_PRIORITY, _Translator, consumers

    class Split(beam.DoFn):
        def process(self, x):
            yield beam.pvalue.TaggedOutput("odd", x) if x % 2 else x

    p = new_pipeline()
    parts = p | beam.Create(list(range(40))) | beam.ParDo(Split()).with_outputs("odd", main="even")
    tens = parts.even | "Tens" >> beam.Map(lambda x: (x // 10, x))
    ones = parts.odd | "Ones" >> beam.Map(lambda x: (x % 10, x))
    both = (tens, ones) | beam.Flatten()
    grouped = both | beam.GroupByKey() | "Sorted" >> beam.MapTuple(lambda k, v: (k, sorted(v)))
    evens = parts.even | "Count" >> beam.Map(lambda x: x)  # parts.even has two readers
    p.replace_all(dask_overrides())
    translator = _Translator(partitions=2, readers=consumers(p))
    p.visit(translator)
    everything = translator.everything()
    graph = dict(everything.__dask_graph__())
    prefixes = [key_split(k) for k in graph]
    # Create 2; Split, Tens, Ones, GroupByKey's own ParDo, Sorted, Count: 2 each and 2 counters
    # each; the Flatten's 4 partitions for that ParDo, joined into 2: each selected next to its
    # stage's output first (4), then gathered (2); the grouping 2 + 2 x 2 + 2
    assert len(graph) == 2 + 6 * 2 + 6 * 2 + 4 + 2 + 8, collections.Counter(prefixes)
    assert collections.Counter(prefixes)["gather"] == 2 and collections.Counter(prefixes)["select"] == 4
    assert not {"_select", "concat", "repartition"} & set(prefixes)
    want = {
        k: sorted([x for x in range(0, 40, 2) if x // 10 == k] + [x for x in range(1, 40, 2) if x % 10 == k])
        for k in range(10)
    }
    with dask.config.set(scheduler="sync"):
        assert {k: v for k, v in translator.bag(grouped).compute()} == {k: v for k, v in want.items() if v}
        assert sorted(translator.bag(evens).compute()) == list(range(0, 40, 2))
    with Client(dask_cluster) as client:  # its scheduler runs in this process (LocalCluster)
        client.run_on_scheduler(_record_priorities)
        try:
            client.compute(everything, optimize_graph=False).result()
        finally:
            client.run_on_scheduler(
                lambda dask_scheduler: dask_scheduler.remove_plugin(name="test-priorities")
            )
    priorities = dict(_PRIORITIES)
    by_prefix: dict[str, set] = {}
    for key, priority in priorities.items():
        by_prefix.setdefault(key_split(key), set()).add(priority)
    assert by_prefix["groupby-split"] == by_prefix["groupby-piece"] == {-PLUMBING_PRIORITY}
    assert by_prefix["counters"] == {-PLUMBING_PRIORITY}
    assert by_prefix["Ones"] == by_prefix["Tens"] == {0}


_PRIORITIES: dict[str, int] = {}  # written by the scheduler's plugin (same process), read by the test


def _record_priorities(dask_scheduler) -> None:
    """Record each task's Dask priority (its user part) as it starts processing."""
    from distributed.diagnostics.plugin import SchedulerPlugin

    class Priorities(SchedulerPlugin):
        name = "test-priorities"

        def transition(self, key, start, finish, *args, **kwargs):
            if finish == "processing":
                _PRIORITIES[str(key)] = dask_scheduler.tasks[key].priority[0]

    _PRIORITIES.clear()
    dask_scheduler.add_plugin(Priorities())


def test_a_shuffles_pieces_run_where_their_split_is(dask_cluster):
    """Each piece of a grouping's shuffle runs on the worker that split its input partition, so
    only pieces move between workers, never a whole split. On a 2-slot cluster a shuffle of 4
    partitions into 4 made 16 pieces off 4 splits, a group Dask's scheduler places as "root-ish"
    (without looking where the input is): in a traced 20,000-document build pieces fetched
    whole splits of feature vectors, 2-2.5 s each with both workers idle."""
    import dask
    import dask.bag as db
    from dask.distributed import Client
    from dask.utils import key_split

    from pipelines.dask_runner import _group_by_key, _Parts
    from pipelines.dask_tasks import WHOLE
    from pipelines.local_cluster import LOCAL_CLUSTER_CONFIG

    with Client(dask_cluster) as client:
        halves = []
        for half, worker in enumerate(sorted(client.scheduler_info()["workers"])):
            with dask.annotate(workers=[worker]):  # two input partitions on each worker
                numbers = db.from_sequence(range(half * 2_000, (half + 1) * 2_000), npartitions=2)
                halves.append(numbers.map(lambda x: (x % 97, x)))
        both = _Parts([[((h.name, i), WHOLE)] for h in halves for i in range(2)], halves)
        grouped = _group_by_key(both, 4)
        client.run_on_scheduler(_record_workers)
        try:  # the scheduler runs in this process: the local cluster's durations apply to it
            with dask.config.set(LOCAL_CLUSTER_CONFIG):
                got = client.compute(grouped, optimize_graph=False).result()
        finally:
            client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.remove_plugin(name="test-workers"))
    assert sorted((k, sorted(v)) for k, v in got) == [
        (k, [x for x in range(4_000) if x % 97 == k]) for k in range(97)
    ]
    ran = dict(_WORKERS)
    splits = {k: w for k, w in ran.items() if key_split(k) == "groupby-split"}
    pieces = {k: w for k, w in ran.items() if key_split(k) == "groupby-piece"}
    assert len(splits) == 4 and len(pieces) == 16
    # the scheduler knows their durations by these prefixes only (LOCAL_CLUSTER_CONFIG, infra/k8s/dask);
    # "select" is the selections' prefix (test_reading_a_stages_output_or_a_flatten_costs_no_task_of_its_own)
    known = {k.rsplit(".", 1)[1] for k in LOCAL_CLUSTER_CONFIG if ".default-task-durations." in k}
    assert {key_split(k) for k in pieces} | {"select"} <= known
    assert len(set(splits.values())) == 2  # each split ran where its input partition was pinned
    for key, worker in pieces.items():
        (split,) = _DEPENDENCIES[key]
        assert worker == splits[split], f"{key} ran away from its split {split}"


_WORKERS: dict[str, str] = {}  # key -> the worker that computed it (the scheduler's plugin writes)
_DEPENDENCIES: dict[str, list[str]] = {}


def _record_workers(dask_scheduler) -> None:
    from distributed.diagnostics.plugin import SchedulerPlugin

    class Workers(SchedulerPlugin):
        name = "test-workers"

        def transition(self, key, start, finish, *args, **kwargs):
            if start == "processing" and finish == "memory":
                _WORKERS[str(key)] = kwargs.get("worker")
                _DEPENDENCIES[str(key)] = [str(d.key) for d in dask_scheduler.tasks[key].dependencies]

    _WORKERS.clear()
    _DEPENDENCIES.clear()
    dask_scheduler.add_plugin(Workers())


def test_a_partition_crosses_between_workers_as_one_pickle():
    """What a task returns travels as one pickle, not element by element: Dask wrote a list of
    7,500 (content id, features) pairs as 15,002 frames (~0.5 s between two local workers, ~0.1
    s as one pickle). The values, their order and the numpy arrays come back equal."""
    import numpy as np
    from distributed.protocol import dumps, loads, to_serialize

    from features import ImageFeatures
    from pipelines.dask_tasks import WHOLE, Partition, _gather, _regroup, _split_by_key

    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(1_000, 16)).astype(np.float32)
    pairs = [(f"{i:064x}", ImageFeatures(features=v)) for i, v in enumerate(vectors)]
    outputs = {
        "gather": _gather([pairs], [WHOLE]),
        "piece": _split_by_key([pairs], [WHOLE], 3)[1],
        "regroup": _regroup([pairs[:10], pairs[5:20]]),
    }
    for name, part in outputs.items():
        assert type(part) is Partition, name
        frames = dumps({"data": to_serialize(part)})  # a message as the workers' comm writes it
        assert len(frames) <= 4, f"{name}: {len(frames)} frames"  # headers, the pickle, its bytes
        back = loads(frames)["data"]
        assert type(back) is Partition and len(back) == len(part)
        for (k1, v1), (k2, v2) in zip(part, back, strict=True):
            assert k1 == k2
            if isinstance(v1, list):
                v1, v2 = v1[0], v2[0]
            np.testing.assert_array_equal(v1.features, v2.features)
    assert len(dumps({"data": to_serialize(list(pairs))})) > 1_000  # a plain list: frames per element
    again = pickle.loads(pickle.dumps(outputs["gather"], protocol=4))  # no out-of-band buffers: in band
    assert type(again) is Partition and [k for k, _ in again] == [k for k, _ in pairs]
