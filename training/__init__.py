"""Models, objectives, the Ray Train loop, evaluation, MLflow tracking and the registered model."""
