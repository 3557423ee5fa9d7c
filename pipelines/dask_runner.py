"""Beam pipelines on a dask.distributed cluster: Apache Beam's DaskRunner with a complete translation.

Why: Beam's DaskRunner (2.77) has five translation gaps that break this project's graphs
(docs/runners.md, "The translation"), so its options and overrides are kept and only the
translation is replaced (``_Translator``): one bag per PCollection, ``finish_bundle`` outputs kept,
every ParDo computed, ``Read`` split into bundles, side inputs computed once, chains fused into one
task per partition (``_Stage``), GroupByKey by a hash the same in every process. Tasks:
``pipelines/dask_tasks.py``."""

from __future__ import annotations

import itertools
import operator
import re
import uuid
from typing import Any

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.metrics.metric import MetricResults
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor
from apache_beam.runners.dask import dask_runner as beam_dask
from apache_beam.runners.dask.overrides import (
    _Create,
    _Flatten,
    _GroupAlsoByWindow,
    _GroupByKeyOnly,
    _Read,
    _Reshuffle,
    dask_overrides,
)
from apache_beam.runners.runner import PipelineResult, PipelineState

from pipelines.dask_tasks import (
    METRICS_TAG,
    WHOLE,
    _Counters,
    _gather,
    _read_bundles,
    _regroup,
    _run_stage,
    _split_by_key,
    _spread,
    _sum_counters,
)
from schemas.errors import MmlinksError

RUNNER_PATH = f"{__name__}.DaskRunner"  # what --runner names for Beam
# A Read's bundles hold at most this many bytes of its source, so a stage's partitions grow with
# a big input instead of staying at twice the task slots (a Dask task holds its partition whole).
# Not smaller: on 2 cores every extra partition costs a task per shuffle partner, and 22 partitions
# made a 20,000-document build (5.4 MB of `data synth` JSON lines, 4 bundles at this size) slower
# than 4 (docs/benchmarks-scale.md).
READ_BUNDLE_BYTES = 4 << 20
# A grouping's partitions stop at this many per task slot: a task shuffle of N partitions makes
# about N x min(N, 32) tasks, so a 1M-document build keeps a graph the scheduler can hold.
MAX_PARTITIONS_PER_SLOT = 16
# Dask's user priority of the translation's own small tasks (``_layer_bag``); a ParDo's is 0.
PLUMBING_PRIORITY = 1


class DaskRunner(beam_dask.DaskRunner):
    """Beam's DaskRunner with ``_Translator`` in place of its translation (module docstring)."""

    def run_pipeline(self, pipeline, options):
        from dask.distributed import Client

        dask_options = options.view_as(beam_dask.DaskOptions).get_all_options(
            drop_default=True, current_only=True
        )
        bag_kwargs = beam_dask.DaskOptions._extract_bag_kwargs(dask_options)
        client = Client(**dask_options)
        try:
            pipeline.replace_all(dask_overrides())
            slots = max(1, sum(client.nthreads().values()))
            translator = _Translator(bag_kwargs.get("npartitions") or 2 * slots, consumers(pipeline))
            pipeline.visit(translator)
            # Dask's own graph optimisation off: its fusing renames keys and would run a side
            # input's upstream twice; the translation fuses ParDo chains itself (_Stage).
            future = client.compute(translator.everything(), optimize_graph=False)
        except BaseException:
            client.close()
            raise
        return DaskPipelineResult(client, future)


class DaskPipelineResult(PipelineResult):
    """The running job: one future whose value is every bundle's counter values."""

    def __init__(self, client, future):
        super().__init__(PipelineState.RUNNING)
        self._client, self._future, self._counters = client, future, None

    def wait_until_finish(self, duration=None):
        if self._counters is not None or self._state != PipelineState.RUNNING:
            return self._state
        try:
            parts = self._future.result(timeout=None if duration is None else duration / 1000)
            self._counters = _sum_counters(parts)
            self._state = PipelineState.DONE
        except BaseException:
            self._state = PipelineState.FAILED
            self._future.cancel()
            raise
        finally:
            self._client.close()
        return self._state

    def cancel(self):
        self._future.cancel()
        self._client.close()
        self._state = PipelineState.CANCELLED
        return self._state

    def metrics(self) -> MetricResults:
        if self._counters is None:
            raise MmlinksError("the Dask job has not finished: no counters yet")
        return _Counters(self._counters)


# --- the translation -----------------------------------------------------------------------------


def consumers(pipeline) -> dict[pvalue.PCollection, int]:
    """How many transforms read each PCollection (as main or side input)."""
    counts: dict[pvalue.PCollection, int] = {}

    class _Count(PipelineVisitor):
        def visit_transform(self, node: AppliedPTransform) -> None:
            for pc in [*node.main_inputs.values(), *(si.pvalue for si in node.side_inputs)]:
                if isinstance(pc, pvalue.PCollection):
                    counts[pc] = counts.get(pc, 0) + 1

    pipeline.visit(_Count())
    return counts


# Translated by what they do, not as DoFns (the overrides' GroupAlsoByWindow and WindowInto are ParDos).
_NOT_PARDOS = (_Create, _Read, _Flatten, _Reshuffle, _GroupByKeyOnly, _GroupAlsoByWindow, beam.WindowInto)


class _Parts:
    """A PCollection before it is a bag: per partition, its sources as (dask key, tag), the tag
    being a fused stage's ``(member index, output tag)`` or ``WHOLE``, with the collections those
    keys come from. A task that reads a PCollection selects its tag itself (``_gather``), so a
    fused stage's output, a Flatten of outputs and a narrowing before a grouping cost no task of
    their own: a 1,000-document Dask build had 1,697 tasks, 514 of them selecting a tag and 334
    concatenating (docs/benchmarks-scale.md), and the local scheduler thread spent ~3.5 ms of
    CPU a task on the driver's two cores."""

    def __init__(self, sources: list[list[tuple[Any, Any]]], deps: list):
        self.sources, self.deps = sources, deps

    @classmethod
    def of(cls, bag, tag: Any = WHOLE) -> _Parts:
        return cls([[((bag.name, i), tag)] for i in range(bag.npartitions)], [bag])

    def uniform(self):
        """``(bag, tag)`` where each partition is the same partition of one bag under one tag
        (a stage reads it with ``map_partitions``); else None."""
        (bag, *more) = self.deps
        if more or len(self.sources) != bag.npartitions:
            return None
        tags = {tag for part in self.sources for _, tag in part}
        keys = [part[0][0] if len(part) == 1 else None for part in self.sources]
        if len(tags) != 1 or keys != [(bag.name, i) for i in range(bag.npartitions)]:
            return None
        return bag, tags.pop()

    def narrowed(self, partitions: int) -> _Parts:
        """At most ``partitions`` partitions, adjacent ones joined in order. A shuffle of N
        partitions into M makes N x M tasks, and a Flatten adds its inputs' partitions up:
        unchecked, the build's joins grew an 8-document build's graph to 109,196 tasks."""
        n = len(self.sources)
        if n <= partitions:
            return self
        cuts = [n * i // partitions for i in range(partitions + 1)]
        return _Parts(
            [[s for part in self.sources[a:b] for s in part] for a, b in itertools.pairwise(cuts)], self.deps
        )


def _layer_bag(name: str, layer: dict, deps: list, npartitions: int):
    """A bag of the translation's own tasks (gathering, grouping, counters), which do no work of
    their own but make other tasks ready: they run first on a worker (``PLUMBING_PRIORITY``).
    At the default priority a worker started a 6-second feature task before the millisecond
    ``getitem`` that the next feature task waited for, and the other worker idled for 6 s."""
    import dask
    from dask.bag import Bag
    from dask.highlevelgraph import HighLevelGraph

    with dask.annotate(priority=PLUMBING_PRIORITY):
        graph = HighLevelGraph.from_collections(name, layer, dependencies=deps)
    return Bag(graph, name, npartitions)


def _selected_first(parts: _Parts) -> _Parts:
    """Where a task joins several partitions, each tagged one is first reduced to its tag by a
    task of its own, next to it: else the joining task would fetch (and hold) whole fused
    partitions, documents and all, to take the few dead letters of one tag."""
    if all(len(part) == 1 for part in parts.sources):
        return parts
    name = f"select-{uuid.uuid4().hex}"
    layer: dict = {}
    sources: list[list[tuple[Any, Any]]] = []
    for part in parts.sources:
        if len(part) == 1:
            sources.append(part)
            continue
        joined = []
        for key, tag in part:
            if tag == WHOLE:
                joined.append((key, tag))
            else:
                select = (f"{name}-{len(layer)}", 0)  # a task group of its own: see _piece
                layer[select] = (_gather, [key], [tag])
                joined.append((select, WHOLE))
        sources.append(joined)
    if not layer:
        return parts
    # This bag only carries the selections' layer as a dependency: its keys are not (name, i), so
    # nothing reads it as a bag (_Parts.uniform looks at the first dependency only).
    return _Parts(sources, [*parts.deps, _layer_bag(name, layer, parts.deps, len(layer))])


def _piece(name: str, source: int, target: int) -> tuple[str, int]:
    """The key of a shuffle's piece: ``source``'s split, the part for ``target``, in one Dask task
    group per target (its pieces from every split), so the scheduler runs it where its split is.

    Dask's scheduler calls a group of more than twice the cluster's task slots that hangs off
    fewer than five tasks "root-ish" and places its tasks without looking at where their input
    is. One group of all pieces, 16 off 4 splits, was root-ish on 2 slots: a piece often ran on
    the other worker and fetched the whole split (all four pieces, 40 MB of feature vectors at
    20,000 documents) to keep a quarter of it, 2-2.5 s each with both workers idle in a traced
    20,000-document build (docs/benchmarks-scale.md). A group per target holds N pieces off N
    splits: root-ish would need N > 2 x slots and N < 5, never on 2 slots or more. A tag's
    selection (``_selected_first``) is a group of its own for the same reason. ``key_split`` of
    either still gives one prefix, so Dask learns their durations across groups."""
    return (f"{name}-{target}", source)


def _realized(parts: _Parts):
    """``parts`` as a bag: the bag itself where it is one bag read whole, else a task per
    partition that gathers its sources' tags."""
    uniform = parts.uniform()
    if uniform is not None and uniform[1] == WHOLE:
        return uniform[0]
    parts = _selected_first(parts)
    name = f"gather-{uuid.uuid4().hex}"
    layer = {
        (name, i): (_gather, [key for key, _ in part], [tag for _, tag in part])
        for i, part in enumerate(parts.sources)
    }
    return _layer_bag(name, layer, parts.deps, len(parts.sources))


class _Stage:
    """ParDos fused into one task per partition: each member reads the main output or a tagged
    output of an earlier member (``source``: (member index, tag)) or, the first, the stage's
    input (``parts``), and no member but the first has side inputs."""

    def __init__(self, parts: _Parts, first: tuple, sides: list):
        self.parts, self.members, self.sides, self.tagged = parts, [(first, None)], sides, None

    def add(self, spec: tuple, source: tuple[int, Any]) -> int:
        self.members.append((spec, source))
        return len(self.members) - 1


class _Translator(PipelineVisitor):
    """Beam's leaf transforms -> dask bags, one bag per PCollection (see the module docstring).

    A chain of ParDos where each reads the previous one's output and nothing else reads that
    output runs as one task per partition (``_Stage``), as Flink and Dataflow fuse it: the
    expensive step's task then depends on the shuffle's output, which Dask places by the bytes
    each worker holds, not on a cheap step that happened to run on one worker (docs/benchmarks.md,
    "Dask runner"), and a build makes fewer tasks. What reads a stage's output selects its tag
    itself, and a Flatten is only a list of its inputs' partitions (``_Parts``)."""

    def __init__(self, partitions: int, readers: dict[pvalue.PCollection, int] | None = None):
        self.partitions = partitions  # at least this many per stage: twice the task slots
        self.widest = partitions  # a grouping's partitions: the most any Read was cut into
        self.most = partitions * MAX_PARTITIONS_PER_SLOT // 2  # partitions count two per slot
        self.readers = readers or {}
        self.bags: dict[pvalue.PCollection, Any] = {}
        self.parts: dict[pvalue.PCollection, _Parts] = {}  # outputs of stages and Flattens
        self.made_by: dict[pvalue.PCollection, tuple[_Stage, int, Any]] = {}  # fused, not yet bags
        self.stages: list[_Stage] = []
        self.job = uuid.uuid4().hex

    def everything(self):
        """One bag that depends on every ParDo and holds only their counter values."""
        import dask.bag as db

        tagged = [self._tagged(stage) for stage in self.stages]
        if not tagged:
            return db.from_sequence([], npartitions=1)
        name = f"counters-{uuid.uuid4().hex}"
        keys = [(bag.name, i) for bag in tagged for i in range(bag.npartitions)]
        layer = {(name, j): (_gather, [key], [METRICS_TAG]) for j, key in enumerate(keys)}
        return _layer_bag(name, layer, tagged, len(keys))

    def view(self, pc: pvalue.PCollection) -> _Parts:
        """What reads ``pc`` reads these partitions; a fused stage's output is final once read."""
        if pc in self.made_by:
            stage, index, tag = self.made_by.pop(pc)
            self.parts[pc] = _Parts.of(self._tagged(stage), (index, tag))
        if pc in self.parts:
            return self.parts[pc]
        return _Parts.of(self.bags[pc])

    def bag(self, pc: pvalue.PCollection):
        """The bag of ``pc`` (for Dask's own operations and the tests)."""
        if pc not in self.bags:
            self.bags[pc] = _realized(self.view(pc))
        return self.bags[pc]

    def _tagged(self, stage: _Stage):
        if stage.tagged is None:
            labels = dict.fromkeys(spec[2].split("/")[0] for spec, _ in stage.members)
            uniform = stage.parts.uniform()
            if uniform is None:
                # a Flatten's many partitions (the dead letters of every step) joined first: a
                # stage task per input partition, and one more reading its counters, cost more
                # than the few elements each holds
                uniform = (_realized(stage.parts.narrowed(self.widest)), WHOLE)
            bag, tag = uniform
            stage.tagged = bag.map_partitions(
                _run_stage,
                list(stage.members),
                *[side[2] for side in stage.sides],
                views=[side[:2] for side in stage.sides],
                tag=tag,
                token=task_name("+".join(labels)),
            )
        return stage.tagged

    def visit_transform(self, node: AppliedPTransform) -> None:
        import dask.bag as db

        t = node.transform
        if isinstance(t, beam.ParDo) and not isinstance(t, _NOT_PARDOS):
            self._pardo(node)
            return
        mains = [p for p in node.main_inputs.values() if isinstance(p, pvalue.PCollection)]
        outs = list(node.outputs.values())
        if isinstance(t, _Flatten) and mains:
            views = [self.view(p) for p in mains]
            deps = list({id(d): d for v in views for d in v.deps}.values())
            flat = _Parts([s for v in views for s in v.sources], deps)
            for out in outs:
                self.parts[out] = flat
            return
        if isinstance(t, _Create):
            values = list(t.values)
            bag = db.from_sequence(values, npartitions=max(1, min(len(values), self.partitions)))
        elif isinstance(t, beam.Impulse):
            bag = db.from_sequence([b""], npartitions=1)
        elif isinstance(t, _Read):
            # one bundle per task slot at least, so the stages after a read start spread out, and
            # bundles of at most READ_BUNDLE_BYTES, so a task's partition does not grow with the input
            size = t.source.estimate_size() or 0
            per = max(1 << 10, min(-(-size // self.partitions), READ_BUNDLE_BYTES))
            bundles = list(t.source.split(desired_bundle_size=per))
            self.widest = max(self.widest, min(len(bundles), self.most))
            bag = db.from_sequence(bundles, npartitions=max(1, len(bundles))).map_partitions(_read_bundles)
        elif isinstance(t, _Flatten):
            bag = db.from_sequence([], npartitions=1)
        elif isinstance(t, _Reshuffle):
            bag = _spread(self.bag(mains[0]), self.partitions)
        elif isinstance(t, _GroupByKeyOnly):
            bag = _group_by_key(self.view(mains[0]), self.widest)
        elif isinstance(t, (_GroupAlsoByWindow, beam.WindowInto)):
            if isinstance(t, beam.WindowInto) and not isinstance(
                t.get_windowing(None).windowfn, beam.window.GlobalWindows
            ):
                raise MmlinksError(f"the Dask runner supports global windows only, not {node.full_label}")
            # values were grouped in the one global window: the input's partitions, as they are
            for out in outs:
                self.parts[out] = self.view(mains[0])
            return
        else:
            raise MmlinksError(
                f"the Dask runner cannot run {type(t).__name__} ({node.full_label}): no translation"
            )
        for out in outs:
            self.bags[out] = bag

    def _pardo(self, node: AppliedPTransform) -> None:
        t = node.transform
        (main,) = [p for p in node.main_inputs.values() if isinstance(p, pvalue.PCollection)]
        spec = (self.job, uuid.uuid4().hex, node.full_label, t.fn, list(t.args), dict(t.kwargs))
        source = self.made_by.get(main)
        if source and not node.side_inputs and self.readers.get(main, 0) == 1 and source[0].tagged is None:
            stage, index, tag = self.made_by.pop(main)
            index = stage.add(spec, (index, tag))
        else:
            sides = [
                (type(si), si._view_options(), _materialized(self.view(si.pvalue))) for si in node.side_inputs
            ]
            stage, index = _Stage(self.view(main), spec, sides), 0
            self.stages.append(stage)
        for tag, out in node.outputs.items():
            self.made_by[out] = (stage, index, None if tag in (None, "None") else tag)


def task_name(label: str) -> str:
    """A ParDo's tasks' key prefix: its Beam label, so Dask's dashboard and task stream say which
    step a task runs (``CNNInference/BeamML_RunInference/...``), not ``_run_stage``."""
    return re.sub(r"[^A-Za-z0-9_./()+]+", "_", label)


def _materialized(parts: _Parts):
    """A side input: its values as one list, in partition order, computed once: one task over
    the partitions. Not ``dask.delayed(_concat)(bag.to_delayed())``, the same task built through
    a Delayed per partition, each merged with the whole upstream graph: 74 s of driver time for
    one FinalizeWrite of an 8-document build."""
    import dask
    from dask.delayed import Delayed
    from dask.highlevelgraph import HighLevelGraph

    name = f"side-input-{uuid.uuid4().hex}"
    sources = [s for part in parts.sources for s in part]
    task = (_gather, [key for key, _ in sources], [tag for _, tag in sources])
    with dask.annotate(priority=PLUMBING_PRIORITY):
        graph = HighLevelGraph.from_collections(name, {name: task}, dependencies=parts.deps)
    return Delayed(name, graph)


# --- what the tasks run (in the worker processes) ------------------------------------------------


def _group_by_key(parts: _Parts, partitions: int):
    """(k, v) pairs -> (k, [v, ...]) in ``partitions`` partitions (the translation's widest Read:
    what a Read cut by size keeps small, a grouping after it keeps small too); keys go to
    partitions by ``stable_hash``. A shuffle of its own, not ``Bag.groupby``'s task shuffle (40
    tasks for 4 partitions into 4, on top of the tasks selecting a stage's tag): per input
    partition one task selects and splits it by hash, one ``getitem`` a target takes its piece
    (only that piece moves between workers), and per target one task groups: N + N x M + M."""
    parts = _selected_first(parts.narrowed(partitions))
    n, m = len(parts.sources), partitions
    token = uuid.uuid4().hex
    split, piece, name = f"groupby-split-{token}", f"groupby-piece-{token}", f"groupby-{token}"
    layer: dict = {}
    for i, part in enumerate(parts.sources):
        layer[(split, i)] = (_split_by_key, [key for key, _ in part], [tag for _, tag in part], m)
        for j in range(m):
            layer[_piece(piece, i, j)] = (operator.getitem, (split, i), j)
    for j in range(m):
        layer[(name, j)] = (_regroup, [_piece(piece, i, j) for i in range(n)])
    return _layer_bag(name, layer, parts.deps, m)


__all__ = ["RUNNER_PATH", "DaskPipelineResult", "DaskRunner", "task_name"]
