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
