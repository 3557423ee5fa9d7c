"""The model families the core trains: each family's registration module and its options class.

Why a list of names: the registries load a family on first lookup, so the core never imports a
family and no family another; adding one is its package plus a line in each tuple below (the
order is ``--help``'s and the order ``TrainConfig`` joins the ``FIELDS`` classes in)."""

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
