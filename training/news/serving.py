"""Alias of ``models.news_serving``, where issue #61 moved the news model's pyfunc.

MLflow pickled the wrapper class of every news model registered before the move by its module
path, ``training.news.serving.NewsModel`` (cloudpickle, by reference): loading such a version
imports this module. It is kept for those versions only (tests/models/test_models_before_61.py);
code imports ``models.news_serving``.
"""

from models.news_serving import ARCHIVE_ENV, SIGNATURE, NewsModel, evaluate_news

__all__ = ["ARCHIVE_ENV", "SIGNATURE", "NewsModel", "evaluate_news"]
