"""The offline ImageNet weights load into our EfficientNet-Lite0 and classify a real photo."""

import numpy as np
import torch
from PIL import Image
from skimage import data

from features import get_extractor
from features.efficientnet_lite import EfficientNetLite0Features, load_pretrained

CAT_CLASSES = {281, 282, 283, 284, 285}  # tabby, tiger cat, Persian, Siamese, Egyptian cat


def test_pretrained_lite0_classifies_chelsea_the_cat():
    model = load_pretrained()
    ext = get_extractor("efficientnet-lite0")
    x = ext.preprocess(Image.fromarray(data.chelsea()))[None]
    with torch.no_grad():
        probs = model(x).softmax(-1)[0]
    top = int(probs.argmax())
    assert top in CAT_CLASSES, top
    assert float(probs[sorted(CAT_CLASSES)].sum()) > 0.8


def test_random_weights_do_not_classify_chelsea():
    """Guards the test above: the cat comes from the pretrained weights, not the preprocessing."""
    from features.efficientnet_lite import EfficientNetLite0

    torch.manual_seed(0)
    model = EfficientNetLite0().eval()
    ext = get_extractor("efficientnet-lite0")
    x = ext.preprocess(Image.fromarray(data.chelsea()))[None]
    with torch.no_grad():
        probs = model(x).softmax(-1)[0]
        feats = EfficientNetLite0Features().eval()(x)
    assert float(probs[sorted(CAT_CLASSES)].sum()) < 0.2
    assert feats.shape == (1, 1280) and np.isfinite(feats.numpy()).all()


def test_features_are_pooled_penultimate_activations():
    model = load_pretrained()
    feat_model = load_pretrained(EfficientNetLite0Features)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        feats = feat_model(x)
        assert torch.allclose(model._fc(feats), model(x), atol=1e-4)


def test_fixed_chunk_forward_is_independent_of_batch_composition():
    ext = get_extractor("efficientnet-lite0")
    model = ext.load_model()
    torch.manual_seed(1)
    images = list(torch.randn(11, 3, 224, 224))
    alone = ext.forward(model, images[:1])[0]
    for batch in (images[:3], images[:11], [images[0], *images[5:9]]):
        assert torch.equal(ext.forward(model, batch)[0], alone)


def test_folded_batchnorm_gives_the_same_features_with_no_batchnorm_left():
    import pytest

    folded = load_pretrained(EfficientNetLite0Features).fold_batchnorm()
    assert not [m for m in folded.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    # random running statistics, so a wrong fold (eps, mean, scale) cannot hide behind BN's defaults
    torch.manual_seed(2)
    ref = load_pretrained(EfficientNetLite0Features)
    for m in ref.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5), m.running_var.uniform_(0.5, 2.0)
    stats = {k: v.clone() for k, v in ref.state_dict().items()}
    x = torch.randn(3, 3, 224, 224)
    with torch.no_grad():
        want = ref(x)
        other = EfficientNetLite0Features().eval()
        other.load_state_dict(stats)
        got = other.fold_batchnorm()(x)
        # activations reach ReLU6's cap here, and the unfolded float32 network is itself ~2e-4
        # off a float64 run of it: the fold must stay within that rounding, far below a wrong fold
        assert (got - want).abs().max() < 1e-3 and got.abs().max() > 1, (got - want).abs().max()
        assert torch.allclose(folded(x), load_pretrained(EfficientNetLite0Features)(x), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="eval-mode"):
        EfficientNetLite0Features().fold_batchnorm()


def test_same_padding_matches_tensorflow_padding_for_every_kernel_stride_and_size():
    """TF 'SAME': the total padding split evenly, the odd pixel on the bottom/right. The layer pads
    through the convolution when the split is even and pads a copy only when it is not."""
    import math

    import torch.nn.functional as F

    from features.efficientnet_lite import SameConv2d

    torch.manual_seed(3)
    for kernel, stride, size, groups in [
        (3, 1, 9, 1),
        (5, 1, 8, 4),
        (3, 2, 8, 4),
        (5, 2, 9, 1),
        (3, 2, 7, 1),
        (1, 1, 5, 1),
    ]:
        conv = SameConv2d(4, 4, kernel, stride=stride, groups=groups, bias=False)
        x = torch.randn(2, 4, size, size + 1)
        pads = [max((math.ceil(n / stride) - 1) * stride + kernel - n, 0) for n in (size + 1, size)]
        (pw, ph) = pads
        padded = F.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2])
        want = F.conv2d(padded, conv.weight, None, stride, 0, 1, groups)
        with torch.no_grad():
            got = conv(x)
        assert got.shape == want.shape == (2, 4, math.ceil(size / stride), math.ceil((size + 1) / stride))
        assert torch.allclose(got, want, atol=1e-6), (kernel, stride, size)
