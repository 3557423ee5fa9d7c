"""Alias of ``models.retrieval_serving``, where issue #61 moved the retrieval model's pyfunc.

Why kept: MLflow pickled earlier versions' wrapper class by its path,
``training.retrieval.serving.RetrievalModel``, so loading one imports this module."""

from models.retrieval_serving import SIGNATURE, RetrievalModel, evaluate_retrieval, log_retrieval_model

__all__ = ["SIGNATURE", "RetrievalModel", "evaluate_retrieval", "log_retrieval_model"]
