"""What the Dask runner's tasks run in a worker process: a fused stage of ParDos over one
partition (``_run_stage``) and GroupByKey's split and regrouping by a process-stable key hash.

Why counters travel with the outputs: a task re-run after its worker died counts once, so the
manifest's counts are exact. DoFns are set up once per worker process and RunInference's model is
shared per process, so a worker loads a model once, not per bundle."""

from __future__ import annotations

import pickle
import zlib
from collections.abc import Iterable
from typing import Any

import apache_beam as beam
from apache_beam.metrics.execution import MetricKey, MetricResult, MetricsContainer
from apache_beam.metrics.metric import MetricResults
from apache_beam.runners.common import Receiver

METRICS_TAG = "__mmlinks_metrics__"
MAIN = None  # the main output's tag
WHOLE = "__mmlinks_whole_partition__"  # a source read whole, not one tag of a fused stage's output

# Per worker process: the current job's set-up DoFns by ParDo id. A long-lived cluster runs job
# after job: the first bundle of a new job tears the previous job's DoFns down (and lets go of
# their models), so a worker holds one job's DoFns at a time.
_dofns: dict[str, Any] = {}
_dofns_job: list[str] = [""]


class Partition(list):
    """What every task of the translation returns: a list that travels between workers as one
    pickle (its bytes one frame, out of band), not element by element.

    Dask serializes a plain list element by element when its first element has a Dask serializer (a
    str, a tuple of them): 15,002 frames for a partition of 7,500 feature vectors, 3-5x slower between
    two local workers than one pickle (docs/benchmarks-scale.md). Pickled with Dask's own ``dumps``
    (cloudpickle where plain pickle cannot), out of band where the pickler takes buffers."""

    def __reduce_ex__(self, protocol):
        from distributed.protocol.pickle import dumps

        data = dumps(list(self))
        # out of band where the pickler can take it (Dask's comm: a frame of its own, not copied)
        return _partition_from, (pickle.PickleBuffer(data) if protocol >= 5 else data,)


def _partition_from(data: bytes) -> Partition:
    from distributed.protocol.pickle import loads

    return Partition(loads(data))


def _selected(part, tag):
    return part if tag == WHOLE else (v for t, v in part if t == tag)


def _gather(parts, tags):
    """The values of each partition (a fused stage's: those of its tag), in order, as one list."""
    return Partition(v for part, tag in zip(parts, tags, strict=True) for v in _selected(part, tag))


def _read_bundles(bundles):
    out = Partition()
    for b in bundles:
        out.extend(b.source.read(b.source.get_range_tracker(b.start_position, b.stop_position)))
    return out


def _spread(bag, partitions: int):
    """Reshuffle: more partitions where there are fewer than the cluster's task slots."""
    return bag if bag.npartitions >= partitions else bag.repartition(npartitions=partitions)


def stable_hash(key) -> int:
    """The same number for an equal key in every process (``hash`` of a str is salted)."""
    return zlib.crc32(pickle.dumps(key, protocol=4))


def _split_by_key(parts, tags, partitions: int) -> list[Partition]:
    pieces = [Partition() for _ in range(partitions)]
    for kv in _gather(parts, tags):
        pieces[stable_hash(kv[0]) % partitions].append(kv)
    return pieces


def _regroup(pieces):
    groups: dict = {}
    for piece in pieces:
        for k, v in piece:
            groups.setdefault(k, []).append(_unwindowed(v))
    return Partition(groups.items())


def _unwindowed(v):
    from apache_beam.utils.windowed_value import WindowedValue

    return v.value if isinstance(v, WindowedValue) else v


class _Collect(Receiver):
    """A Receiver: every output of a bundle as a ``(tag, value)`` pair, in emission order."""

    def __init__(self, out: list, tag):
        self.out, self.tag = out, tag

    def receive(self, windowed_value):
        self.out.append((self.tag, _unwindowed(windowed_value)))


class _Forward(Receiver):
    """A Receiver that hands each output straight to the fused member that reads it."""

    def __init__(self, bundle: _Bundle):
        self.bundle = bundle

    def receive(self, windowed_value):
        self.bundle.process(_unwindowed(windowed_value))


class _Receivers(dict):
    """Per output tag: forward to the member that reads it (``readers``) or collect into ``out``."""

    def __init__(self, out: list, index: int, readers: dict):
        super().__init__()
        self.out, self.index, self.readers = out, index, readers

    def __missing__(self, tag):
        reader = self.readers.get((self.index, tag))
        self[tag] = receiver = (
            _Forward(reader) if reader is not None else _Collect(self.out, (self.index, tag))
        )
        return receiver


def _forget_dofns(job: str) -> None:
    for old in _dofns.values():
        try:
            old.teardown()
        except Exception:  # an earlier job's teardown must not fail this job
            pass
    _dofns.clear()
    _dofns_job[0] = job


def _run_stage(items, members, *side_values, views, tag=WHOLE):
    """One partition through a fused stage, element by element, as a Beam SDK worker runs fused
    steps: each member's DoFn runs the partition as one bundle, and what a member emits goes
    straight into the member that reads it (``finish_bundle`` outputs too, before that member
    finishes). So a task holds its input, the outputs no member reads and one element in flight,
    not every member's outputs at once (run member after member, a 20,000-document build's
    RunInference member grew its worker by ~300 MB, its outputs held until the next member ran;
    the rest of a feature worker's growth was heap malloc kept, now trimmed: features.cpu_heap.HeapTrim).
    Returns those outputs as ((member index, tag), value) and, last, all counters under METRICS_TAG."""
    from apache_beam.runners.worker import statesampler
    from apache_beam.utils.counters import CounterFactory

    out = Partition()
    readers: dict = {}
    bundles: list[_Bundle] = []
    # Readers first (a member reads an earlier one), so each receiver knows its bundle.
    for index in reversed(range(len(members))):
        spec, source = members[index]
        first = index == 0
        bundle = _Bundle(
            spec,
            _Receivers(out, index, readers),
            side_values if first else (),
            views if first else [],
        )
        if source is not None:
            readers[source] = bundle
        bundles.insert(0, bundle)
    # A sampler per task: a sampler keeps the first container it was given for a state name.
    previous = statesampler.get_current_tracker()
    sampler = statesampler.StateSampler("dask", CounterFactory())
    statesampler.set_current_tracker(sampler)
    try:
        for bundle in reversed(bundles):  # a reader is ready before anything reaches it
            bundle.start(sampler)
        for item in _selected(items, tag):
            bundles[0].process(item)
        for bundle in bundles:  # a member's finish_bundle outputs reach its reader first
            bundle.finish()
    finally:
        statesampler.set_current_tracker(previous)
    counters: dict = {}
    for bundle in bundles:
        counters.update(bundle.counters())
    out.append((METRICS_TAG, counters))
    return out


class _Bundle:
    """One member's DoFn over one partition as one Beam bundle: start, process each, finish, with
    its outputs handed to ``receivers`` and its counters in its own MetricsContainer."""

    def __init__(self, spec, receivers: _Receivers, side_values, views):
        from apache_beam.runners.common import DoFnContext, DoFnInvoker, DoFnSignature, _OutputHandler
        from apache_beam.transforms.core import DoFn
        from apache_beam.transforms.sideinputs import SideInputMap
        from apache_beam.transforms.window import GlobalWindow, GlobalWindows
        from apache_beam.utils.windowed_value import WindowedValue

        job, key, label, fn, args, kwargs = spec
        if _dofns_job[0] != job:
            _forget_dofns(job)
        self.fresh = key not in _dofns
        fn = _dofns.setdefault(key, fn)
        self.label, self.window = label, (GlobalWindow(),)
        self.wrap = WindowedValue
        handler = _OutputHandler(
            window_fn=GlobalWindows(),
            main_receivers=receivers[MAIN],
            tagged_receivers=receivers,
            per_element_output_counter=None,
            output_batch_converter=None,
            process_yields_batches=False,
            process_batch_yields_elements=False,
        )
        sides = [
            SideInputMap(kind, view, [WindowedValue(v, 0, (GlobalWindow(),)) for v in values])
            for (kind, view), values in zip(views, side_values, strict=True)
        ]
        self.invoker = DoFnInvoker.create_invoker(
            DoFnSignature(fn),
            handler,
            context=DoFnContext(label, state=None),
            side_inputs=sides,
            input_args=args,
            input_kwargs=kwargs,
            user_state_context=None,
            bundle_finalizer_param=DoFn.BundleFinalizerParam(),
        )
        self.container = MetricsContainer(label)
        self.state = None

    def start(self, sampler) -> None:
        self.state = sampler.scoped_state(self.label, "process", metrics_container=self.container)
        with self.state:
            if self.fresh:
                self.invoker.invoke_setup()  # once per worker process, as on a Beam SDK worker
            self.invoker.invoke_start_bundle()

    def process(self, item) -> None:
        with self.state:  # counters of this member's DoFn, also when called from another's
            self.invoker.invoke_process(self.wrap(item, 0, self.window))

    def finish(self) -> None:
        with self.state:
            self.invoker.invoke_finish_bundle()

    def counters(self) -> dict:
        return {
            (self.label, k.metric.namespace, k.metric.name): int(v)
            for k, v in self.container.get_cumulative().counters.items()
            if v
        }


class _Counters(MetricResults):
    """Summed bundle counters as Beam's MetricResults (committed = attempted: each counted once)."""

    def __init__(self, counters: dict[tuple[str, str, str], int]):
        self._results = [
            MetricResult(MetricKey(step, beam.metrics.metricbase.MetricName(ns, name)), v, v)
            for (step, ns, name), v in sorted(counters.items())
        ]

    def query(self, filter=None):
        chosen = [r for r in self._results if filter is None or self.matches(filter, r.key)]
        return {
            self.COUNTERS: chosen,
            self.DISTRIBUTIONS: [],
            self.GAUGES: [],
            self.STRINGSETS: [],
            self.BOUNDED_TRIES: [],
        }


def _sum_counters(parts: Iterable[dict]) -> dict[tuple[str, str, str], int]:
    total: dict[tuple[str, str, str], int] = {}
    for part in parts:
        for key, value in part.items():
            total[key] = total.get(key, 0) + value
    return total
