"""Document linking (Hessel et al. 2019, Li et al. 2021): the link family's models, objectives,
baselines and spread analysis; ``training.link.registration`` registers its backbones and
objectives with the core's registries."""
