"""Alias of ``models.packaging``, where issue #61 moved the link model's pyfunc.

Why kept: MLflow pickled earlier versions' wrapper class by its path,
``training.packaging.LinkModel``, so loading one imports this module."""

from models.packaging import SIGNATURE, ImageFeaturizer, LinkModel, log_link_model, pip_requirements

__all__ = ["SIGNATURE", "ImageFeaturizer", "LinkModel", "log_link_model", "pip_requirements"]
