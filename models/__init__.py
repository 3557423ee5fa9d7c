"""What a trained model becomes: packaged as an MLflow pyfunc, registered, promoted behind the
gate (and rolled back), served. Above ``training`` and ``archive``, below ``linking``; a run
reaches it only through ``models.experiment.package_run``."""
