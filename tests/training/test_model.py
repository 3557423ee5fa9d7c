"""MulLink's sentence poolings: unit vectors, blind to padding, and the paper's one unchanged."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from training.model import ModelConfig, MulLink
from training.text_pooling import TEXT_POOLING


def _model(pooling: str, seed: int = 0) -> MulLink:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=30, word_dim=8, image_dim=5, d_multi=6, text_pooling=pooling)
    return MulLink(cfg).eval()


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(sorted(TEXT_POOLING)), st.integers(1, 6), st.integers(0, 4), st.integers(0, 999))
def test_every_pooling_gives_unit_vectors_that_ignore_padding(pooling, length, extra_pad, seed):
    model = _model(pooling)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(2, 30, (1, length), generator=g)
    padded = torch.cat([tokens, torch.zeros(1, extra_pad, dtype=torch.long)], dim=1)
    a = model.text(tokens, torch.tensor([length]))
    b = model.text(padded, torch.tensor([length]))
    assert a.shape == (1, 6)
    assert torch.allclose(a.norm(dim=-1), torch.ones(1), atol=1e-5)
    assert torch.allclose(a, b, atol=1e-5)


def test_last_is_the_grus_final_state_as_in_the_paper():
    model = _model("last")
    tokens, lengths = torch.tensor([[3, 4, 5]]), torch.tensor([3])
    _, h = model.text.gru(model.text.embed(tokens))
    expected = torch.nn.functional.normalize(h[-1], dim=-1)
    assert torch.allclose(model.text(tokens, lengths), expected, atol=1e-6)


def test_mean_pooling_is_the_mean_of_the_grus_states():
    model = _model("mean")
    tokens, lengths = torch.tensor([[3, 4, 5]]), torch.tensor([3])
    states, _ = model.text.gru(model.text.embed(tokens))
    expected = torch.nn.functional.normalize(states.mean(1), dim=-1)
    assert torch.allclose(model.text(tokens, lengths), expected, atol=1e-6)


def test_a_model_config_saved_before_pooling_existed_loads_as_the_paper_model():
    cfg = ModelConfig(vocab_size=30, word_dim=8, image_dim=5, d_multi=6).to_dict()
    cfg.pop("text_pooling")
    assert ModelConfig(**cfg).text_pooling == "last"


def test_an_unknown_pooling_is_refused():
    with pytest.raises(ValueError, match="unknown text pooling 'sum'"):
        _model("sum")
