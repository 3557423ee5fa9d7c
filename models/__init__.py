"""What a trained model becomes: packaged as an MLflow pyfunc (link, retrieval, news), registered,
promoted to ``production`` behind the evaluation gate (and rolled back), served.

A training run reaches this layer through one call: ``training.experiment.run_experiment`` is
handed ``models.experiment.package_run`` and calls it to log and register the run's model.
Above ``training`` and ``archive``, below ``linking`` and the front ends.
"""
