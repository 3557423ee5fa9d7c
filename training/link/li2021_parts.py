"""The names of Li et al. 2021's loss terms, in the order they are summed.

C: cross-document (TK, k = full), I: intra-document, D: dropout sub-documents. Its own module so
that the registry (read by ``training.config``, no torch) and the loss (torch) share it without
importing each other.
"""

LI2021_PARTS = ("C", "I", "D")
