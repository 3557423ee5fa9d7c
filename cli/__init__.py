"""``mmlinks``: the command line, one module per command group (the top layer: nothing imports it).

``main`` builds the parser from each group's ``add_parsers`` and runs the chosen command; the
commands call library functions in ``pipelines/`` and ``training/`` and return a dict that is
printed as one JSON object (``--json``) or by the command's own ``show`` function.
"""
