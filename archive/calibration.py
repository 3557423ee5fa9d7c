"""How an ivfpq archive index's search is set: by measurement at build time (issue #38).

``calibrate`` keeps the cheapest re-rank factor and probe count (``CALIBRATION_FACTORS``) that
reaches ``TARGET_RECALL`` against the exact search on the calibration queries."""

from __future__ import annotations

import numpy as np

# ivfpq's nprobe and re-rank factor are measured at build time (``calibrate``): the cheapest
# whose recall@10 against exact search reaches this on the calibration queries. One fixed
# setting cannot serve both ends: random vectors need every cell probed for 0.95 at 1M, a
# trained model's embeddings ~3 % of them (docs/benchmarks.md, issue #38)
TARGET_RECALL = 0.97
CALIBRATION_QUERIES = 200
CALIBRATION_NOISE = 0.5  # query = vector + noise * N(0, I/d): a near neighbour, not the vector
# re-rank factors tried: at 1M a trained model's clustered embeddings need 300 for 0.97 on
# noisy queries, random vectors 50-100 (docs/benchmarks.md, issue #38)
CALIBRATION_FACTORS = (100, 300, 1000)


def _faiss():
    import faiss

    return faiss


def calibrate(
    index,
    target: float = TARGET_RECALL,
    queries: np.ndarray | None = None,
    count: int = CALIBRATION_QUERIES,
    seed: int = 0,
) -> dict:
    """Choose an ivfpq ``index``'s nprobe and re-rank factor by measurement: for each factor of
    ``CALIBRATION_FACTORS`` (ascending), the fewest cells (1, 2, 4, ... or all) whose
    recall@10 against ``exact_search_rows`` reaches ``target``; the first factor that gets
    there wins (else the best recall seen). ``queries``: the vectors the served model will
    search with (a news archive: its articles' text vectors, ``build_model_archive``);
    default ``count`` of its own vectors plus noise (seeded). A factor stops climbing the
    probes once two doublings gained under 0.002 (the re-rank, not the cells, limits it).
    What it measured is saved in index.json."""
    if index.kind != "ivfpq" or not len(index):
        return {}
    rng = np.random.default_rng(seed)
    source = "given"
    if queries is None or not len(queries):
        rows = np.sort(rng.choice(index.live_rows(), size=min(count, len(index)), replace=False))
        noise = rng.standard_normal((len(rows), index.dim)).astype(np.float32) / np.sqrt(index.dim)
        queries, source = index.vectors(rows) + CALIBRATION_NOISE * noise, "noisy database vectors"
    q = np.ascontiguousarray(queries, dtype=np.float32)
    q /= np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    k = min(10, len(index))
    truth = index.exact_search_rows(q, k)
    cells = int(_faiss().downcast_index(index.index.base_index).nlist)
    ladder = sorted({min(cells, 1 << i) for i in range(cells.bit_length() + 1)})
    measured, best = {}, None
    for factor in CALIBRATION_FACTORS:
        gains = []
        for nprobe in ladder:
            index.set_search(nprobe=nprobe, k_factor=factor)
            got = index.search_rows(q, k)[1]
            r = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(got, truth, strict=True)]))
            measured[f"nprobe={nprobe} k_factor={factor}"] = round(r, 4)
            if best is None or r > best[0] + 1e-9:
                best = (r, nprobe, factor)
            gains.append(r)
            if r >= target or (len(gains) >= 3 and gains[-1] - gains[-3] < 0.002):
                break
        if best[0] >= target:
            break
    index.set_search(nprobe=best[1], k_factor=best[2])
    index.calibration = {"target": target, "queries": len(q), "query_source": source, "seed": seed}
    index.calibration.update(recall=round(best[0], 4), measured=measured)
    return index.calibration
