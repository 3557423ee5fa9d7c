"""Alias of ``models.retrieval_serving``, where issue #61 moved the retrieval model's pyfunc.

MLflow pickled the wrapper class of every retrieval model registered before the move by its
module path, ``training.retrieval.serving.RetrievalModel`` (cloudpickle, by reference): loading
such a version imports this module. It is kept for those versions only
(tests/models/test_models_before_61.py); code imports ``models.retrieval_serving``.
"""

from models.retrieval_serving import SIGNATURE, RetrievalModel, evaluate_retrieval, log_retrieval_model

__all__ = ["SIGNATURE", "RetrievalModel", "evaluate_retrieval", "log_retrieval_model"]
