"""Batch linking at corpus scale: a registered link model over every document of a dataset (or
of raw documents), as a Beam job, written as versioned link shards (``mmlinks link``)."""
