"""The model families the core trains: one line per family's registration module, and one per
family's training options.

Each family registers its objectives and backbones in the core's registries from its own
``registration`` module, which the registries load on their first lookup: nothing in the core
imports a family and no family imports another, so adding a family is its package plus a line in
each tuple below. The order is that of the names in ``--help`` (the pretrained towers, part of the
link family, come last, as they were added last). ``FIELDS`` names each family's dataclass of
``TrainConfig`` options (``MODULE:CLASS``), joined with the core's in this order.
"""

from importlib import import_module

FAMILIES = (
    "training.link.registration",  # document linking: Hessel et al. 2019, Li et al. 2021
    "training.retrieval.registration",  # coherence retrieval: Alikhani et al.
    "training.news.registration",  # news image selection: Liu et al.
    "training.link.tower_registration",  # link: pretrained towers (MiniLM, CLIP; issue #20)
)

FIELDS = (
    "training.link.config:LinkFields",
    "training.retrieval.config:RetrievalFields",
    "training.news.config:NewsFields",
)

_loaded = False


def load_families() -> None:
    """Import every family's registration module once (before the first registry lookup)."""
    global _loaded
    if _loaded:
        return
    _loaded = True  # first: a registration module's own lookups must not load again
    for name in FAMILIES:
        import_module(name)


def family_fields() -> tuple[type, ...]:
    """Each family's options dataclass, in ``FIELDS`` order (imported by name, as the
    registrations are: the core names no family module)."""
    classes = []
    for entry in FIELDS:
        module, _, name = entry.partition(":")
        classes.append(getattr(import_module(module), name))
    return tuple(classes)
