"""Coherence-aware text-to-image retrieval (Alikhani et al.): metrics, the CMCA/CMCM models,
their losses and the selective similarity refinement (issue #17). Pure torch/numpy."""
