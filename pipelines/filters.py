"""The paper's document filters, configurable per source, each counting what it removed
(Hessel et al. 2019's presets per source: ``PRESETS``).

Why after validation and near-duplicate removal, before features: no CNN time is spent on a
document then thrown away. A document failing several rules counts under the first, so the
manifest's removal counts add up."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from schemas.errors import MmlinksError
from schemas.text import tokenize


@dataclass(frozen=True)
class DocumentFilter:
    first_sentences: int | None = None  # keep only the first N sentences (WIKI: 100)
    min_sentences: int = 1
    max_sentences: int | None = None
    min_images: int = 1
    max_images: int | None = None
    long_caption_tokens: int = 5
    min_long_captions: int = 0  # sentences with >= long_caption_tokens tokens (DIY: 2)
    min_links: int = 0  # labelled documents: at least this many ground-truth links (RecipeQA: 1)

    def params(self) -> dict:
        return asdict(self)

    @classmethod
    def from_options(cls, preset: str, overrides: dict[str, str] | None = None) -> DocumentFilter:
        """A preset (see PRESETS) with ``name=value`` overrides, e.g. {"max_images": "20"}."""
        if preset not in PRESETS:
            raise MmlinksError(f"unknown filter preset {preset!r}; known: {sorted(PRESETS)}")
        values = asdict(PRESETS[preset])
        known = {f.name for f in fields(cls)}
        for key, raw in (overrides or {}).items():
            if key not in known:
                raise MmlinksError(f"unknown filter option {key!r}; known: {sorted(known)}")
            if raw.lower() in ("none", ""):
                values[key] = None
                continue
            try:
                values[key] = int(raw)
            except ValueError:
                raise MmlinksError(f"filter option {key} wants an integer or 'none', not {raw!r}") from None
        return cls(**values)

    def apply(self, doc: dict) -> tuple[dict | None, str | None, int]:
        """Return (document, None, links_cut) when kept (possibly truncated), else (None, rule, 0).

        ``doc`` is the validated document dict (``sentences``, ``images``, ``links``).
        ``links_cut`` counts ground-truth links that pointed past the sentence cut-off.
        """
        links_cut = 0
        if self.first_sentences is not None and len(doc["sentences"]) > self.first_sentences:
            n = self.first_sentences
            links = doc["links"]
            if links is not None:
                kept = [(s, i) for s, i in links if s < n]
                links_cut = len(links) - len(kept)
                links = kept
            doc = {**doc, "sentences": doc["sentences"][:n], "links": links}
        n_sent, n_img = len(doc["sentences"]), len(doc["images"])
        if n_sent < self.min_sentences:
            return None, "too_few_sentences", 0
        if self.max_sentences is not None and n_sent > self.max_sentences:
            return None, "too_many_sentences", 0
        if n_img < self.min_images:
            return None, "too_few_images", 0
        if self.max_images is not None and n_img > self.max_images:
            return None, "too_many_images", 0
        if self.min_long_captions:
            long = sum(len(tokenize(s)) >= self.long_caption_tokens for s in doc["sentences"])
            if long < self.min_long_captions:
                return None, "too_few_long_captions", 0
        if self.min_links and doc["links"] is not None and len(doc["links"]) < self.min_links:
            return None, "too_few_links", 0
        return doc, None, links_cut


PRESETS: dict[str, DocumentFilter] = {
    "none": DocumentFilter(),
    "diy": DocumentFilter(
        min_sentences=2, max_sentences=40, min_images=2, max_images=40, min_long_captions=2
    ),
    "wiki": DocumentFilter(first_sentences=100, min_sentences=10, min_images=3),
    "recipeqa": DocumentFilter(min_sentences=2, min_images=2, min_links=1),
}

# The preset a source gets unless the user names one.
SOURCE_PRESETS = {"diy": "diy", "wiki": "wiki", "recipeqa": "recipeqa"}


def filter_for(
    source: str, preset: str | None = None, overrides: dict[str, str] | None = None
) -> DocumentFilter:
    return DocumentFilter.from_options(preset or SOURCE_PRESETS.get(source, "none"), overrides)
