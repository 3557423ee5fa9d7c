"""How a served news model uses its machine (issue #18): the torch and FAISS threads it encodes
and searches on, per predict call (``SERVE_THREADS``, packaged with the model), and the garbage
collector frozen after the load under ``mlflow models serve`` (``SCORING_SERVER_ENV``)."""

from __future__ import annotations

import gc
from contextlib import contextmanager

import torch

from schemas.errors import MmlinksError

# threads a served article is encoded (torch) and searched (FAISS) on; packaged in news.json
# (``log_news_model(threads=...)``), None: the libraries' defaults. torch and faiss-cpu each
# ship their own OpenMP runtime with its own spinning worker pool; measured on 2 cores in
# docs/benchmarks.md (issue #18, ``benchmarks/news_serving_latency.py --thread-sweep``, retired in
# issue #61 at d839ce0)
SERVE_THREADS = {"encode": 1, "search": 1}

# set by `mlflow models serve` in the process that loads the model to serve it
# (mlflow.pyfunc.scoring_server._SERVER_MODEL_PATH; not imported: that module imports FastAPI)
SCORING_SERVER_ENV = "__pyfunc_model_path__"


def freeze_gc() -> int:
    """Collect, then move every object alive (the loaded libraries, model and archive: ~350k
    tracked objects) to the garbage collector's permanent generation (``gc.freeze``); how many.
    Without it, a full collection traverses them all in the middle of some request: 180 ms of
    CPU once in 200 served articles, a gen-1 pass up to 19 ms (docs/benchmarks.md, issue #18).
    Reference counting still frees them; only cycles among them are never collected, so this
    is for a process that loads the model to serve it (``NewsModel.load_context`` calls it
    under ``mlflow models serve``), not for a test or training process."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def checked_threads(threads) -> dict | None:
    """``threads`` as packaged: None (the libraries' defaults) or ``{"encode": n, "search": m}``
    with positive integers; anything else is refused in one line when a model is packaged or
    loaded, not on every request (torch refuses 0 threads mid-predict)."""
    if threads is None:
        return None
    ok = isinstance(threads, dict) and set(threads) == {"encode", "search"}
    if not ok or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in threads.values()):
        raise MmlinksError(
            f'serving threads must be {{"encode": n, "search": m}} with n, m >= 1, got {threads!r}'
        )
    return dict(threads)


@contextmanager
def serving_threads(threads: dict | None):
    """Run a predict call with ``threads["encode"]`` torch and ``threads["search"]`` FAISS
    threads, restored afterwards (a process that loaded the model to embed an archive keeps its
    own settings). OpenMP thread counts are per calling thread, so setting them per call also
    covers a server that predicts on pool threads."""
    if not threads:
        yield
        return
    import faiss

    before = torch.get_num_threads(), faiss.omp_get_max_threads()
    torch.set_num_threads(threads["encode"])
    faiss.omp_set_num_threads(threads["search"])
    try:
        yield
    finally:
        torch.set_num_threads(before[0])
        faiss.omp_set_num_threads(before[1])
