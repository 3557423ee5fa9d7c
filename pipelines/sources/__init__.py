"""Source connectors: each a Beam PTransform from a raw source to RawDocument records."""

from __future__ import annotations

import apache_beam as beam

from schemas.errors import MmlinksError


def get_source(name: str, input_path: str) -> beam.PTransform:
    if name == "synthetic":
        from pipelines.sources.synthetic import ReadSyntheticCorpus

        return ReadSyntheticCorpus(input_path)
    raise MmlinksError(f"unknown source {name!r}; known: ['synthetic']")
