"""Alias of ``models.news_serving``, where issue #61 moved the news model's pyfunc.

Why kept: MLflow pickled earlier versions' wrapper class by its path,
``training.news.serving.NewsModel``, so loading one imports this module."""

from models.news_serving import ARCHIVE_ENV, SIGNATURE, NewsModel, evaluate_news

__all__ = ["ARCHIVE_ENV", "SIGNATURE", "NewsModel", "evaluate_news"]
