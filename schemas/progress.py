"""The one progress-reporting path: a tqdm bar on stderr fed by polling what the work reports.

Why polling: Ray Train workers and a Beam runner work out of this process's sight, so a
``poll`` function is called every ``interval_s`` from one thread; without it the bar shows
elapsed time."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator

# poll() -> (units done so far, postfix) or None when the source is busy (the bar just waits)
Poll = Callable[[], tuple[int, dict] | None]


@contextlib.contextmanager
def polled_progress(
    desc: str,
    *,
    total: int | None = None,
    unit: str = "it",
    poll: Poll | None = None,
    interval_s: float = 2.0,
    enabled: bool = True,
) -> Iterator[None]:
    """A bar for the body of the ``with`` block (nothing at all when not ``enabled``)."""
    if not enabled:
        yield
        return
    from tqdm import tqdm

    fmt = None if poll is not None else "{desc}: {elapsed} elapsed"
    stop = threading.Event()
    with tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, bar_format=fmt) as bar:

        def pump() -> None:
            while not stop.wait(interval_s):
                polled = poll() if poll is not None else None
                if polled and (polled[0] > bar.n or not bar.n):  # before the first: what goes on
                    bar.update(polled[0] - bar.n)
                    bar.set_postfix(polled[1])
                else:
                    bar.refresh()  # the elapsed time moves on

        thread = threading.Thread(target=pump, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=5)
