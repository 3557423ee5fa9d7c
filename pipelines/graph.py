"""The build's Beam graph: read -> validate -> unique ids -> near-duplicates -> filters ->
splits -> features -> shards; every stage hands its dead letters on to one JSONL file. Step
labels are stable names (runner UIs, metrics)."""

from __future__ import annotations

import apache_beam as beam

from features import get_extractor
from pipelines.build_config import BuildConfig
from pipelines.dedupe import FindDuplicateDocuments
from pipelines.feature_steps import attach_features
from pipelines.filters import DocumentFilter
from pipelines.records import DEAD_LETTER, count, dead_letter, dead_lettered
from pipelines.shards_writer import write_outputs
from pipelines.sources import source_outputs
from pipelines.splits import assign_split, sized_assignment, split_rank_key
from pipelines.validate import LoadAndValidate
from schemas.config_fields import OFF


def build_pipeline(p: beam.Pipeline, cfg: BuildConfig, staging: str) -> None:
    extractor = get_extractor(cfg.extractor, **cfg.extractor_options)
    region_extractor = get_extractor(cfg.regions, **cfg.region_options) if cfg.region_extractor() else None
    docs, dead = read_and_validate(p, cfg)
    docs = keep_unique_ids(docs, dead)
    if cfg.dedupe_threshold != OFF:
        docs = drop_near_duplicates(docs, dead, cfg)
    docs = apply_filter(docs, dead, cfg.document_filter())
    docs = assign_splits(docs, cfg)
    docs, feature_dead = attach_features(docs, cfg, extractor, region_extractor)
    write_outputs(docs, dead + feature_dead, cfg, staging)


# --- stages -------------------------------------------------------------------------------------


def read_and_validate(p: beam.Pipeline, cfg: BuildConfig):
    """The source's raw documents with every image loaded through the image store."""
    spec, ctx = cfg.spec(), cfg.source_context()
    raw_docs, raw_dead = source_outputs(p | "Read" >> spec.make(ctx))
    fetcher = spec.fetcher(ctx) if spec.fetcher is not None else None
    checked = raw_docs | "Validate" >> dead_lettered(
        LoadAndValidate(cfg.store_root(), cfg.placeholders(), fetcher), "docs"
    )
    return checked.docs, [raw_dead, checked[DEAD_LETTER]]


def keep_unique_ids(docs, dead: list):
    """Documents whose id no other document shares (all sharers are dead-lettered)."""
    unique = (
        docs
        | "KeyById" >> beam.Map(lambda d: (d["doc_id"], d))
        | "GroupById" >> beam.GroupByKey()
        | "UniqueIds" >> beam.FlatMap(unique_doc_ids).with_outputs(DEAD_LETTER, main="docs")
    )
    dead.append(unique[DEAD_LETTER])
    return unique.docs


def drop_near_duplicates(docs, dead: list, cfg: BuildConfig):
    verdicts = docs | "FindDuplicates" >> FindDuplicateDocuments(
        threshold=cfg.dedupe_threshold, policy=cfg.dedupe_policy
    )
    deduped = (
        {
            "doc": docs | "KeyForDedupe" >> beam.Map(lambda d: (d["doc_id"], d)),
            "verdict": verdicts | "KeyVerdicts" >> beam.Map(lambda v: (v.doc_id, v)),
        }
        | "JoinVerdicts" >> beam.CoGroupByKey()
        | "DropDuplicates" >> beam.FlatMap(drop_duplicates).with_outputs(DEAD_LETTER, main="docs")
    )
    dead.append(deduped[DEAD_LETTER])
    return deduped.docs


def apply_filter(docs, dead: list, rules: DocumentFilter):
    filtered = docs | "Filter" >> dead_lettered(ApplyFilter(rules), "docs")
    dead.append(filtered[DEAD_LETTER])
    return filtered.docs


def assign_splits(docs, cfg: BuildConfig):
    """The source's own split, else fixed sizes (smallest rank keys first), else hashed ratios."""
    sized = None
    if cfg.split_sizes is not None:
        total = sum(cfg.split_sizes.values())
        sized = beam.pvalue.AsSingleton(
            docs
            | "Unsplit" >> beam.Filter(lambda d: not d["split"])
            | "RankKey" >> beam.Map(lambda d: split_rank_key(d["doc_id"]))
            | "FirstByRank" >> beam.combiners.Top.Smallest(max(total, 1))
            | "SizedSplits"
            >> beam.Map(lambda ranked: sized_assignment([i for _, i in ranked], cfg.split_sizes))
        )
    return docs | "Split" >> beam.Map(with_split, cfg.split_ratios, sized)


# --- their element functions and DoFns ---------------------------------------------------------


def unique_doc_ids(kv):
    doc_id, docs = kv
    docs = list(docs)
    if len(docs) == 1:
        yield docs[0]
        return
    for _ in docs:
        yield dead_letter("document", doc_id, "duplicate_doc_id", f"{len(docs)} documents share this id")


def drop_duplicates(kv):
    doc_id, grouped = kv
    verdicts = list(grouped["verdict"])
    for doc in grouped["doc"]:
        if verdicts:
            v = verdicts[0]
            yield dead_letter(
                "document",
                doc_id,
                "near_duplicate",
                f"an image is within {v.distance} bits of an image of {v.duplicate_of}",
            )
        else:
            yield doc


class ApplyFilter(beam.DoFn):
    def __init__(self, rules: DocumentFilter):
        self.rules = rules

    def process(self, doc: dict):
        kept, rule, links_cut = self.rules.apply(doc)
        if kept is None:
            yield dead_letter("document", doc["doc_id"], f"filter_{rule}")
            return
        if links_cut:
            count("links_cut_with_sentences", links_cut)
        yield kept


def with_split(doc: dict, ratios: dict[str, float], sized: dict[str, str] | None):
    if doc["split"]:  # the source defines its own splits (VIST, RecipeQA)
        return doc
    if sized is not None:
        return {**doc, "split": sized.get(doc["doc_id"], "train")}
    return {**doc, "split": assign_split(doc["doc_id"], ratios)}
