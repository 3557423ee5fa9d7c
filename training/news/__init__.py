"""News image selection (Liu et al., "Upgrading the Newsroom", issue #18): the multi-source text
encoder and fusers (``model.py``, the character-level CHAIN encoder ``chain.py``), the VSE /
VSE++ / HAL / ORDER losses (``losses.py``) and the ``news`` objective (``objective.py``). The
names below are the registry of the news model's choices, read by ``training.config`` (the
flags' allowed values) without torch and dispatched by ``model.py`` / ``losses.py``."""

FUSERS = ("max", "add", "mlp", "attention")
LOSSES = ("vse", "vsepp", "hal", "order")
# per-source text encoders: the paper's self-attention + point-wise CNN over word vectors, or
# CHAIN (Wehrmann & Barros 2018: characters -> 1-D convolutions, no word embedding)
ENCODERS = ("attention", "chain")
# how a text and an image score: the cosine, or ORDER's negative order violation (Vendrov et al.)
SCORES = ("cosine", "order")
# how a word's vector and its n-gram vectors pool into one (``model.WordEmbedding``): their sum
# / sqrt(count) (the default: measured better than the mean on random-initialised vectors,
# docs/benchmarks.md issue #46) or their plain mean (the paper's, on pre-trained fastText vectors)
SUBWORD_POOLINGS = ("sum-sqrt", "mean")
# --subword-buckets -1 (auto) for the news word encoder: fast on CPU (issue #34)
AUTO_SUBWORD_BUCKETS = 20000
# --news-max-tokens: a news body keeps ~300 words (Liu et al. cut nothing; GoodNews bodies run
# 400-800 words), a headline its few
DEFAULT_NEWS_MAX_TOKENS = "headline=30,lead=80,body=300,caption=60"
