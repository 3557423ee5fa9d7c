"""The news sample layout in document shards (issue #18): one row per (article, image).

The present sources are the row's ``sentences`` in ``NEWS_SOURCES`` order, each linked to image
0, named in ``metadata["news_sources"]``; ``metadata`` also holds ``language``, ``date`` and
``article_id``."""

from __future__ import annotations

NEWS_SOURCES = ("headline", "lead", "body", "caption")
SOURCES_KEY = "news_sources"


def sources_of(metadata: dict | None) -> list[str]:
    """The source name of each sentence of a row, from its metadata; ValueError for a name
    outside ``NEWS_SOURCES`` or out of order."""
    names = [n for n in (metadata or {}).get(SOURCES_KEY, "").split(",") if n]
    order = [NEWS_SOURCES.index(n) if n in NEWS_SOURCES else -1 for n in names]
    if -1 in order or order != sorted(set(order)):
        raise ValueError(
            f"bad {SOURCES_KEY} {','.join(names)!r}: a subset of {','.join(NEWS_SOURCES)}, in order"
        )
    return names


def parse_sources(text: str) -> tuple[str, ...]:
    """'headline,body' -> ('headline', 'body') in ``NEWS_SOURCES`` order; ValueError otherwise."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in NEWS_SOURCES]
    if not names or bad or len(set(names)) != len(names):
        raise ValueError(f"news sources {text!r}: distinct names among {', '.join(NEWS_SOURCES)}")
    return tuple(n for n in NEWS_SOURCES if n in names)


def parse_token_limits(text: str) -> dict[str, int]:
    """'headline=30,body=300' -> {source: tokens kept}; ValueError for an unknown source, a
    repeated one or a count below 1 (``--news-max-tokens``)."""
    out: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in NEWS_SOURCES:
            raise ValueError(f"{part!r} is not SOURCE=TOKENS with SOURCE one of {', '.join(NEWS_SOURCES)}")
        if name in out:
            raise ValueError(f"source {name!r} is given twice")
        try:
            out[name] = int(value)
        except ValueError:
            raise ValueError(f"{part!r}: {value.strip()!r} is not a whole number") from None
        if out[name] < 1:
            raise ValueError(f"{part!r}: at least 1 token")
    return out


def check_news_dataset(manifest, data: str) -> list[str]:
    """What a dataset lacks for ``--objective news``: its rows must be news samples (metadata
    naming their sources, what ``--source news-jsonl`` / ``goodnews`` build); read from the
    first train shard only, so it costs one small read."""
    from schemas.shards import read_table

    paths = manifest.shard_paths(data, "train")[:1]
    if not paths:
        return [f"{data} has no train shard"]
    meta = read_table(paths, columns=["metadata"]).column("metadata").to_pylist()
    if not meta or any(SOURCES_KEY not in dict(m or {}) for m in meta):
        return [
            f"{data} (source {manifest.source}) does not hold news samples (metadata "
            f"{SOURCES_KEY!r}); build one with --source news-jsonl or goodnews"
        ]
    return []
