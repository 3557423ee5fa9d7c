"""News image selection (Liu et al., "Upgrading the Newsroom", issue #18): the multi-source text
encoder and fusers (``model.py``), the VSE / VSE++ / HAL losses (``losses.py``) and the ``news``
objective (``objective.py``). The names below are read by ``training.config`` without torch."""

FUSERS = ("max", "add", "mlp", "attention")
LOSSES = ("vse", "vsepp", "hal")
