"""Alias of ``models.packaging``, where issue #61 moved the link model's pyfunc.

MLflow pickled the wrapper class of every link model registered before the move by its module
path, ``training.packaging.LinkModel`` (cloudpickle, by reference): loading such a version
imports this module. It is kept for those versions only (tests/models/test_models_before_61.py);
code imports ``models.packaging``.
"""

from models.packaging import SIGNATURE, ImageFeaturizer, LinkModel, log_link_model, pip_requirements

__all__ = ["SIGNATURE", "ImageFeaturizer", "LinkModel", "log_link_model", "pip_requirements"]
