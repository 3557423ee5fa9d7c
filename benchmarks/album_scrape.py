"""Benchmark imgur album scraping against the loopback fixture server; print one JSON object.

Both phases go through ``AlbumScraper`` with the ``diy`` source's own HTTP policy
(``policy_from_context``), so the numbers are the connector's, not a hand-tuned client's:
1. **Throughput** (impolite, ``--threads`` concurrent, cache off): ``albums_per_s_impolite``
   (parsing included; target >= 50/s).
2. **Politeness** (``--rate`` per host): the server records each arrival; ``polite_within_limit``
   is the strict test that no 1-second window ``[t, t+1)`` holds more than ``rate`` requests.
   The client spaces starts 1.05/rate apart (``RATE_MARGIN``): at exactly 1/rate, a few ms of
   jitter at the server lets a window catch ``rate + 1``.

The server runs in its own process (it would otherwise share this process's GIL with the
parsers); one process with a thread pool is one Beam worker's view. Wall-clock numbers move with
machine load; compare numbers from one run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fixtures is not installed

from pipelines.crawl_state import CrawlState
from pipelines.sources import get_spec
from pipelines.sources.http_options import policy_from_context
from pipelines.sources.imgur import AlbumFailed, AlbumScraper
from pipelines.web import PoliteClient


def make_albums(prefix: str, n: int, images: int, seed0: int):
    from tests.fixtures.imgur import FixtureAlbum, FixtureImage

    words = "sand the oak board before gluing both edges with care and clamp it overnight".split()
    out = []
    for k in range(n):
        ims = [
            FixtureImage(
                f"{prefix}{k:05d}{j:02d}",
                " ".join(words[(k + j + i) % len(words)] for i in range(9)) if j % 4 != 3 else None,
                "jpg",
                seed0 + k * images + j,
            )
            for j in range(images)
        ]
        out.append(FixtureAlbum(f"{prefix}{k:06d}", ims, title=f"Project {k}"))
    return out


def serve(albums_spec: tuple[int, int, int], commands, results) -> None:
    """Server process: build the albums, pre-render their pages, then answer commands."""
    from tests.fixtures.imgur import ImgurFixtureServer

    n, images, polite_n = albums_spec
    albums = make_albums("B", n, images, 0) + make_albums("P", polite_n, images, 10_000_000)
    with ImgurFixtureServer(albums) as srv:
        for album in albums:
            srv._page(album)  # render now, not inside the timed phase
        results.put(srv.host)
        while True:
            cmd = commands.get()
            if cmd == "reset":
                srv.reset_counts()
                results.put("ok")
            elif cmd == "arrivals":
                results.put(list(srv.arrivals))
            else:
                break


def scraper_for(host: str, state_dir: str, options: dict[str, str]) -> AlbumScraper:
    spec = get_spec("diy")
    base = f"http://{host}"
    opts = {"allow_private": "true", "http_cache": "off", **options}
    ctx = spec.context(state_dir, opts, state_dir)
    client = PoliteClient(policy_from_context(ctx, {host}))
    return AlbumScraper(client, CrawlState(state_dir), page_base=base, image_base=base)


def scrape_all(scraper: AlbumScraper, ids: list[str], threads: int) -> tuple[float, int]:
    def one(album_id: str) -> bool:
        try:
            return bool(scraper.scrape(album_id).images)
        except AlbumFailed:
            return False

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        ok = sum(pool.map(one, ids))
    return time.perf_counter() - t0, ok


def window_stats(times: list[float]) -> tuple[int, float | None]:
    """(most arrivals in any [t, t+1) window starting at an arrival, smallest gap)."""
    times = sorted(times)
    best, j = 0, 0
    for i, t in enumerate(times):
        j = max(j, i)
        while j < len(times) and times[j] < t + 1.0:
            j += 1
        best = max(best, j - i)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return best, (min(gaps) if gaps else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--albums", type=int, default=2000)
    ap.add_argument("--images", type=int, default=16, help="images per album (the paper's median: 16)")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--rate", type=float, default=5.0, help="polite requests per second per host")
    ap.add_argument("--polite-threads", type=int, default=8)
    ap.add_argument("--polite-seconds", type=float, default=4.0)
    ap.add_argument("--json", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args()
    polite_n = max(2, int(args.rate * args.polite_seconds))

    ctx = mp.get_context("spawn")
    commands, results = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=serve, args=((args.albums, args.images, polite_n), commands, results))
    proc.start()
    try:
        host = results.get(timeout=300)
        with tempfile.TemporaryDirectory() as tmp:
            fast = scraper_for(
                host, f"{tmp}/fast", {"polite": "false", "concurrency": str(args.threads), "retries": "2"}
            )
            ids = [f"B{k:06d}" for k in range(args.albums)]
            fast_s, fast_ok = scrape_all(fast, ids, args.threads)

            commands.put("reset")
            results.get(timeout=60)
            polite = scraper_for(
                host,
                f"{tmp}/polite",
                {"polite": "true", "rate": str(args.rate), "concurrency": str(args.polite_threads)},
            )
            polite_ids = [f"P{k:06d}" for k in range(polite_n)]
            polite_s, polite_ok = scrape_all(polite, polite_ids, args.polite_threads)
            commands.put("arrivals")
            arrivals = [t for t, _ in results.get(timeout=60)]
    finally:
        commands.put("stop")
        proc.join(timeout=30)
    max_rate, min_gap = window_stats(arrivals)
    span = max(arrivals) - min(arrivals) if len(arrivals) > 1 else 0.0
    mean_rate = (len(arrivals) - 1) / span if span > 0 else None
    out = {
        "albums": args.albums,
        "images_per_album": args.images,
        "threads": args.threads,
        "albums_ok_impolite": fast_ok,
        "seconds_impolite": round(fast_s, 3),
        "albums_per_s_impolite": round(args.albums / fast_s, 1),
        "polite_rate_limit": args.rate,
        "polite_albums": polite_n,
        "polite_albums_ok": polite_ok,
        "polite_requests": len(arrivals),
        "polite_seconds": round(polite_s, 3),
        "polite_max_rate_observed": max_rate,
        "polite_min_spacing_s": None if min_gap is None else round(min_gap, 4),
        "polite_mean_rate": None if mean_rate is None else round(mean_rate, 3),
        "polite_within_limit": max_rate <= args.rate,
    }
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:28s} {v}")


if __name__ == "__main__":
    main()
