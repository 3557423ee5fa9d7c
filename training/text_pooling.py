"""The names of the GRU backbone's sentence poolings (no torch: ``training.config`` reads them)."""

# How a sentence becomes one vector. "last" is the paper's (the GRU's final state); the others
# are the pooling ablations of docs/benchmarks.md ("Confounded documents").
TEXT_POOLING = {
    "last": "GRU final hidden state (Hessel et al. 2019)",
    "mean": "mean of the GRU's states over the sentence's tokens",
    "max": "element-wise max of the GRU's states over the sentence's tokens",
    "bigru": "bidirectional GRU (d_multi / 2 units each way), both final states",
    "bag": "mean of the word embeddings, then a linear map to d_multi (no GRU)",
}
