"""The CITE source on a fixture in the released layout (tests/fixtures/cite/data.csv: the
authors' `|`-separated data.csv) joined to RecipeQA's image folders."""

from __future__ import annotations

from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from pipelines.direct_runner import DirectRunner
from pipelines.records import DEAD_LETTER
from pipelines.sources import get_spec
from pipelines.sources.cite import RELATIONS, ReadCite, clean_text, parse_cite_csv, recipe_of
from schemas.errors import MmlinksError

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "cite" / "data.csv"


def recipeqa_images(root: Path) -> Path:
    """RecipeQA's layout: <root>/images/images-qa/<split>/images-qa/<file>, small noise images
    (a build refuses blank ones)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    files = (
        ("train", "fluffy-pancakes_2_0.jpg"),
        ("val", "fluffy-pancakes_1_0.jpg"),
        ("test", "sun-tea_1_0.jpg"),
    )
    for split, name in files:
        folder = root / "images" / "images-qa" / split / "images-qa"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(folder / name)
    return root


def test_rows_become_pairs_with_the_papers_relations():
    out = list(parse_cite_csv(FIXTURE.read_text(), str(FIXTURE)))
    rows = {r["doc_id"]: r for r in out if isinstance(r, dict)}
    dead = [(sid, reason) for sid, reason, _ in (r for r in out if not isinstance(r, dict))]
    assert sorted(rows) == ["cite-data-21", "cite-data-3", "cite-data-7", "cite-data-9"]
    assert rows["cite-data-3"]["metadata"]["relations"] == "Expansion,Temporal-i-after-t"
    whisk = rows["cite-data-7"]
    assert whisk["text"] == "Whisk 2 cups of flour, 1 egg and 1 1/2 cups of milk until smooth."  # &#160;
    assert whisk["metadata"]["relations"] == "Expansion,ImageNeeded,Elaboration-t,Temporal-i-during-t"
    assert whisk["metadata"]["recipe_id"] == "fluffy-pancakes" and whisk["metadata"]["recipe_step"] == "1"
    assert whisk["metadata"]["cite_q10"] == "False" and whisk["metadata"]["cite_q1"] == "whisk the batter"
    assert rows["cite-data-21"]["metadata"]["relations"] == ""
    assert dead == [("data:12", "bad_label"), ("data:15", "no_text")]
    assert recipe_of("1.png") is None and clean_text(" a&amp;b \n c ") == "a&b c"
    assert next(iter(parse_cite_csv("a|b\n1|2\n", "odd.csv")))[1] == "bad_header"


def test_beam_transform_joins_recipeqa_images(tmp_path):
    root = recipeqa_images(tmp_path / "recipeqa")
    spec = get_spec("cite")
    ctx = spec.context(str(FIXTURE), {"recipeqa": str(root)}, str(tmp_path / "state"))
    spec.check(ctx)
    assert spec.relations(ctx) == list(RELATIONS)
    with pytest.raises(MmlinksError, match="recipeqa=DIR"):
        spec.check(spec.context(str(FIXTURE), {}, str(tmp_path / "state")))
    with beam.Pipeline(runner=DirectRunner()) as p:
        out = p | ReadCite(str(FIXTURE), str(root))
        assert_that(
            out.documents | beam.Map(lambda d: (d.doc_id, Path(d.image_uris[0]).parent.parent.name)),
            equal_to([("cite-data-3", "train"), ("cite-data-7", "val"), ("cite-data-21", "test")]),
            label="docs",
        )
        assert_that(
            out[DEAD_LETTER] | beam.Map(lambda d: (d.source_id, d.reason)),
            equal_to(
                [
                    ("cite-data-9", "image_not_in_recipeqa"),
                    ("data:12", "bad_label"),
                    ("data:15", "no_text"),
                ]
            ),
            label="dead",
        )


def test_a_lone_carriage_return_is_a_line_break_not_a_crash(tmp_path):
    """Found by tests/faults/test_table_fuzz.py: a lone \\r in an unquoted field stopped the
    step with csv.Error (the text was read through a StringIO that splits on \\n only)."""
    from pipelines.sources.cite import COLUMNS

    row = "|".join(["0", "5", "", *["True"] * 7, "", "", "pie_1_0.jpg", "s1", "Bake it."])
    text = "|".join(COLUMNS) + "\n" + row.replace("Bake it.", "Bake\rit.") + "\n" + row + "\n"
    out = list(parse_cite_csv(text, "data.csv"))
    # csv reads the \r as a line break: "Bake" ends the row, "it." is a row without text
    assert [o[1] for o in out if isinstance(o, tuple)] == ["no_text"]
    assert [o["text"] for o in out if isinstance(o, dict)] == ["Bake", "Bake it."]


def test_a_field_over_the_csv_limit_ends_the_file_with_one_reason(monkeypatch):
    import csv

    from pipelines.sources import csvtable
    from pipelines.sources.cite import COLUMNS

    limit = csv.field_size_limit()  # process-wide: csv_rows sets it, restored for later tests
    monkeypatch.setattr(csvtable, "FIELD_LIMIT", 100)
    try:
        out = list(parse_cite_csv("|".join(COLUMNS) + "\n" + "x" * 101 + "\n", "data.csv"))
    finally:
        csv.field_size_limit(limit)
    assert [(o[0], o[1]) for o in out] == [("data.csv", "malformed_csv")]
