"""The baselines by name (``mmlinks baseline --method``) and the name result tables show.

Apart from ``training.link.baselines`` so that building the CLI's parser imports no torch or scipy
(every ``mmlinks`` command builds the whole parser; ``--help`` took seconds for that import).
"""

BASELINES = {
    "random": "Random",
    "object-detection": "Obj Detect",
    "nostruct": "NoStruct",
    "clip-zero-shot": "CLIP zero-shot",
}
