"""Model zoo of the FL engine: the architectures used by the FedGuCci, FLOCO and IMA papers.

Every zoo model ends in an ``nn.Linear`` named ``classifier`` (FLOCO replaces it by a
simplex of linear layers; ``classifier_name`` finds it in any model). CNNs designed for
28x28 or 32x32 inputs accept smaller ones (e.g. 1x8x8 digits): such inputs are first
upsampled bilinearly to the smallest side the architecture can process (``min_side``),
so the layers themselves stay as in the papers. Flatten sizes come from a dummy forward.
"""
from __future__ import annotations

import copy
import re
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from landscape.infra.errors import ConfigError

from .datasets import canonical_name, unknown_dataset

MODELS: tuple[str, ...] = ("mlp", "mnist1d_mlp", "mnist1d_cnn", "mnist1d_lenet",
                           "fedgucci_cnn", "floco_cnn", "ima_cnn", "ima_digit_cnn",
                           "resnet20_bn", "resnet20_gn", "resnet18_gn")
TORCHVISION_PREFIX = "tv:"
#: Suffix of a model name whose parameters are frozen except the classifier's (``"mnist1d_cnn+head"``).
HEAD_ONLY = "+head"

_DEFAULT_MODEL = {"digits": "mlp", "mnist1d": "mnist1d_cnn", "mnist": "ima_cnn", "fashionmnist": "ima_cnn",
                  "cifar10": "fedgucci_cnn", "cifar100": "fedgucci_cnn", "svhn": "fedgucci_cnn"}


class MLP(nn.Module):
    """Fully connected ReLU network on flattened inputs (64-64-64-10 for digits)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int,
                 hidden: tuple[int, ...] = (64, 64)):
        super().__init__()
        in_features = 1
        for d in input_shape:
            in_features *= d
        layers: list[nn.Module] = [nn.Flatten()]
        for width in hidden:
            layers += [nn.Linear(in_features, width), nn.ReLU()]
            in_features = width
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of a batch ``x``."""
        return self.classifier(self.features(x))


class Mnist1dMLP(nn.Module):
    """The MNIST-1D paper's MLP (Greydanus and Kobak 2024, models of its benchmark code).

    ``h1 = relu(W1 x)``, ``h2 = h1 + relu(W2 h1)`` (a residual second layer), logits ``W3 h2``;
    ``width`` hidden units (100 in the paper). Parameters: ``w^2 + (d + C + 2) w + C`` for ``d``
    inputs and ``C`` classes.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, width: int = 100):
        super().__init__()
        in_features = 1
        for d in input_shape:
            in_features *= d
        self.flatten = nn.Flatten()
        self.linear1 = nn.Linear(in_features, width)
        self.linear2 = nn.Linear(width, width)
        self.classifier = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of a batch ``x``."""
        h = F.relu(self.linear1(self.flatten(x)))
        return self.classifier(h + F.relu(self.linear2(h)))


class Mnist1dCNN(nn.Module):
    """The MNIST-1D paper's 1-D CNN.

    Three ``Conv1d`` + ReLU layers with ``width`` channels (25 in the paper; kernel 5 stride 2
    pad 1, then kernel 3 stride 2 pad 1 twice), flatten, linear classifier. On length-40
    signals the lengths are 19, 10, 5, so the classifier reads ``5 * width`` features;
    parameters ``6 w^2 + (6 + 5C) w + C`` for one input channel.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, width: int = 25):
        super().__init__()
        if len(input_shape) != 2:
            raise ConfigError(f"mnist1d_cnn needs signals shaped (C, L), got {input_shape}.")
        self.features = nn.Sequential(
            nn.Conv1d(input_shape[0], width, 5, stride=2, padding=1), nn.ReLU(),
            nn.Conv1d(width, width, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv1d(width, width, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            flat = self.features(torch.zeros(1, *input_shape)).shape[1]
        self.classifier = nn.Linear(flat, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of a batch ``x``."""
        return self.classifier(self.features(x))


class Mnist1dLeNet(nn.Module):
    """:class:`Mnist1dCNN`'s convolutions, then FLOCO's SimpleCNN head: linear 120, linear 84, classifier.

    FLOCO's SimpleCNN (two convolutions, then ``400 -> 120 -> 84 -> C``) spends about 1% of its
    parameters on the classifier; ``mnist1d_cnn``'s classifier holds about a quarter of its. With
    the default width 64 the classifier here is ``85 C`` of ``6 w^2 + 608 w + 10284 + 85 C``
    parameters (1.1% for C = 10), the SimpleCNN's proportion on MNIST-1D signals.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, width: int = 64):
        super().__init__()
        self.convolutions = Mnist1dCNN(input_shape, num_classes, width).features
        with torch.no_grad():
            flat = self.convolutions(torch.zeros(1, *input_shape)).shape[1]
        self.head = nn.Sequential(nn.Linear(flat, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU())
        self.classifier = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of a batch ``x``."""
        return self.classifier(self.head(self.convolutions(x)))


class MinSizeUpsample(nn.Module):
    """Bilinear upsampling of inputs whose height or width is below ``min_side``."""

    def __init__(self, min_side: int):
        super().__init__()
        self.min_side = min_side

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` upsampled bilinearly to at least ``min_side`` pixels per side (unchanged when large enough)."""
        h, w = x.shape[-2:]
        if min(h, w) >= self.min_side:
            return x
        size = (max(h, self.min_side), max(w, self.min_side))
        return F.interpolate(x, size=size, mode="bilinear", align_corners=False)

    def extra_repr(self) -> str:
        """The minimum side."""
        return f"min_side={self.min_side}"


class ConvNet(nn.Module):
    """Convolutional ``features`` -> flatten -> fully connected ``head`` -> ``classifier``.

    ``head_widths`` are the hidden fully connected widths; the first one's input size is
    measured by a forward pass of a zero image of ``input_shape`` (after upsampling).
    """

    def __init__(self, features: nn.Sequential, input_shape: tuple[int, ...], num_classes: int,
                 head_widths: tuple[int, ...], activation: Callable[[], nn.Module], min_side: int):
        super().__init__()
        if len(input_shape) != 3:
            raise ConfigError(f"a CNN needs inputs shaped (C, H, W), got {input_shape}.")
        self.resize = MinSizeUpsample(min_side)
        self.features = features
        with torch.no_grad():
            flat = self.features(self.resize(torch.zeros(1, *input_shape))).numel()
        layers: list[nn.Module] = [nn.Flatten()]
        for width in head_widths:
            layers += [nn.Linear(flat, width), activation()]
            flat = width
        self.head = nn.Sequential(*layers)
        self.classifier = nn.Linear(flat, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of a batch ``x``."""
        return self.classifier(self.head(self.features(self.resize(x))))


def fedgucci_cnn(input_shape: tuple[int, ...], num_classes: int) -> ConvNet:
    """FedGuCci's SimpleCNN (FedGuCci App. A.5).

    conv3-32, pool, conv3-64, pool, conv3-64, FC(1024->64), FC(64->C); ReLU, PyTorch
    default init. Minimum input side 18.
    """
    c = input_shape[0]
    features = nn.Sequential(nn.Conv2d(c, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(64, 64, 3), nn.ReLU())
    return ConvNet(features, input_shape, num_classes, (64,), nn.ReLU, min_side=18)


def floco_cnn(input_shape: tuple[int, ...], num_classes: int) -> ConvNet:
    """FLOCO's CifarCNN (the FLOCO authors' code).

    conv5-16 (pad 0), conv5-32 (pad 1), conv3-64 (pad 1), each with LeakyReLU and maxpool 2;
    FC(576->128), LeakyReLU, classifier(128->C). Xavier-normal weights, zero biases. Minimum input side
    16.
    """
    c = input_shape[0]
    features = nn.Sequential(nn.Conv2d(c, 16, 5), nn.LeakyReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(16, 32, 5, padding=1), nn.LeakyReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1), nn.LeakyReLU(), nn.MaxPool2d(2))
    model = ConvNet(features, input_shape, num_classes, (128,), nn.LeakyReLU, min_side=16)
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_normal_(m.weight)
            nn.init.zeros_(m.bias)
    return model


def ima_cnn(input_shape: tuple[int, ...], num_classes: int) -> ConvNet:
    """IMA's FedAvg CNN (IMA Table 4).

    Two conv5 + ReLU + maxpool 2 blocks, then FC(->384), FC(384->128), FC(128->C). 32
    channels for 1-channel inputs (FMNIST CNN, flatten 512 on 28x28), 64 for colour
    inputs (CIFAR-10 CNN, flatten 1600 on 32x32). ReLU after FC(384->128) as in the
    released code (Table 4 omits it). No normalisation layers (the paper's GroupNorm is
    in its VGG/ResNet/Digit-Five models). Min side 16.
    """
    c = input_shape[0]
    width = 32 if c == 1 else 64
    features = nn.Sequential(nn.Conv2d(c, width, 5), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(width, width, 5), nn.ReLU(), nn.MaxPool2d(2))
    return ConvNet(features, input_shape, num_classes, (384, 128), nn.ReLU, min_side=16)


def ima_digit_cnn(input_shape: tuple[int, ...], num_classes: int, groups: int = 2) -> ConvNet:
    """IMA's Digit-Five CNN (IMA Table 4; FedBN's DigitModel with GroupNorm(2)).

    Three conv5 (stride 1, pad 2) + GN + ReLU blocks, max-pool 2 after the first two,
    FC(->2048), FC(2048->128), classifier(128->C); flatten 6272 on 28x28 inputs. ReLU after
    both hidden FCs as in the code. Min side 4 (no upsampling needed for 8x8 digits).
    """
    c = input_shape[0]
    features = nn.Sequential(
        nn.Conv2d(c, 64, 5, 1, 2), nn.GroupNorm(groups, 64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 5, 1, 2), nn.GroupNorm(groups, 64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 5, 1, 2), nn.GroupNorm(groups, 128), nn.ReLU())
    return ConvNet(features, input_shape, num_classes, (2048, 128), nn.ReLU, min_side=4)


def _norm(kind: str, channels: int, groups: int) -> nn.Module:
    return nn.BatchNorm2d(channels) if kind == "bn" else nn.GroupNorm(groups, channels)


class BasicBlock(nn.Module):
    """Residual block of two 3x3 convs (He et al. 2016).

    ``shortcut="A"``: parameter-free identity, subsampled and zero-padded in channels
    when the shape changes (CIFAR ResNets); ``"B"``: 1x1 conv + norm projection.
    """

    def __init__(self, in_planes: int, planes: int, stride: int, norm: str, groups: int,
                 shortcut: str):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = _norm(norm, planes, groups)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = _norm(norm, planes, groups)
        self.pad = 0
        self.stride = stride
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            if shortcut == "A":
                self.pad = planes - in_planes
            else:
                self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride, bias=False),
                                              _norm(norm, planes, groups))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block's output on ``x``: two convolutions plus the shortcut, then ReLU."""
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.pad:
            skip = x[:, :, ::self.stride, ::self.stride]
            skip = F.pad(skip, (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))
        else:
            skip = self.shortcut(x)
        return F.relu(out + skip)


class ResNet(nn.Module):
    """CIFAR-style ResNet.

    3x3 stem (no max-pool), stages of BasicBlocks, global average pooling, optional
    linear ``projector`` + ReLU, and the ``classifier``.
    """

    def __init__(self, in_channels: int, num_classes: int, widths: tuple[int, ...],
                 blocks: tuple[int, ...], norm: str, groups: int, shortcut: str,
                 projector: int | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False)
        self.bn1 = _norm(norm, widths[0], groups)
        stages, in_planes = [], widths[0]
        for i, (width, n) in enumerate(zip(widths, blocks)):
            stride = 1 if i == 0 else 2
            layers = []
            for j in range(n):
                layers.append(BasicBlock(in_planes, width, stride if j == 0 else 1, norm, groups, shortcut))
                in_planes = width
            stages.append(nn.Sequential(*layers))
        self.layers = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.projector = nn.Sequential(nn.Linear(in_planes, projector), nn.ReLU()) if projector else nn.Identity()
        self.classifier = nn.Linear(projector or in_planes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of a batch ``x``."""
        out = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.classifier(self.projector(torch.flatten(self.pool(out), 1)))


def resnet20(input_shape: tuple[int, ...], num_classes: int, norm: str = "bn",
             groups: int = 2) -> ResNet:
    """CIFAR ResNet-20 (He et al. 2016, §4.2).

    3 stages x 3 blocks, widths 16/32/64, option-A shortcuts, Kaiming-normal conv/linear
    init, as FedGuCci's code (about 0.27M parameters). ``norm="gn"`` uses GroupNorm with
    ``groups`` groups (IMA uses 2).
    """
    model = ResNet(input_shape[0], num_classes, (16, 32, 64), (3, 3, 3), norm, groups, "A")
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight)
    return model


def resnet18_gn(input_shape: tuple[int, ...], num_classes: int, groups: int = 2) -> ResNet:
    """IMA's ResNet-18 (IMA Table 4).

    CIFAR variant (3x3 stem, no max-pool), 4 stages x 2 blocks of widths 64/128/256/512
    with projection shortcuts, GroupNorm(2) everywhere, linear projector 512->128 (+ReLU,
    as in the code) and classifier 128->C.
    """
    return ResNet(input_shape[0], num_classes, (64, 128, 256, 512), (2, 2, 2, 2), "gn", groups,
                  "B", projector=128)


_ZOO: dict[str, Callable[[tuple[int, ...], int], nn.Module]] = {
    "mlp": lambda shape, k: MLP(shape, k),
    "mnist1d_mlp": Mnist1dMLP,
    "mnist1d_cnn": Mnist1dCNN,
    "mnist1d_lenet": Mnist1dLeNet,
    "fedgucci_cnn": fedgucci_cnn,
    "floco_cnn": floco_cnn,
    "ima_cnn": ima_cnn,
    "ima_digit_cnn": ima_digit_cnn,
    "resnet20_bn": lambda shape, k: resnet20(shape, k, "bn"),
    "resnet20_gn": lambda shape, k: resnet20(shape, k, "gn"),
    "resnet18_gn": resnet18_gn,
}


def build_model(name: str | nn.Module | Callable[[], nn.Module], *, num_classes: int,
                input_shape: tuple[int, ...], seed: int = 0) -> nn.Module:
    """Build a model with deterministic initialisation for ``seed``.

    ``name`` is a zoo name (``MODELS``; the models with a width option also accept
    ``"<name>_w<width>"``, e.g. ``"mnist1d_mlp_w256"``), ``"tv:<torchvision model>"`` (weights=None,
    ``num_classes`` set, nothing else adapted; 3-channel inputs), an ``nn.Module``
    (returned as a deep copy), or a zero-argument callable returning a module. A zoo or
    torchvision name ending in ``"+head"`` (``"mnist1d_cnn+head"``) freezes every parameter but the
    classifier's (``classifier_name``): the run trains and averages the head only (linear probing;
    LSS's official code trains its FedAvg baseline so). The global torch RNG is left exactly as it was.
    """
    if isinstance(name, nn.Module):
        return copy.deepcopy(name)
    input_shape = tuple(int(d) for d in input_shape)
    if num_classes < 1:
        raise ConfigError(f"num_classes must be >= 1, got {num_classes}.")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if callable(name) and not isinstance(name, str):
            model = name()
            if not isinstance(model, nn.Module):
                raise ConfigError(f"the model factory returned {type(model).__name__}, not an nn.Module.")
            return model
        if name.endswith(HEAD_ONLY):
            return head_only(build_model(name[:-len(HEAD_ONLY)], num_classes=num_classes, input_shape=input_shape,
                                         seed=seed))
        if name.startswith(TORCHVISION_PREFIX):
            return _torchvision_model(name[len(TORCHVISION_PREFIX):], num_classes, input_shape)
        base, width = _split_width(name)
        if base not in _ZOO:
            raise ConfigError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}, "
                              f"'{TORCHVISION_PREFIX}<torchvision model name>', an nn.Module or a factory.")
        return _ZOO[base](input_shape, num_classes) if width is None else _ZOO[base](input_shape, num_classes,
                                                                                     width=width)


def head_only(model: nn.Module) -> nn.Module:
    """``model`` with every parameter but its classifier's (:func:`classifier_name`) frozen (in place)."""
    head = classifier_name(model)
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith(head + "."))
    return model


def _split_width(name: str) -> tuple[str, int | None]:
    """``"mnist1d_mlp_w256"`` -> ``("mnist1d_mlp", 256)``; other names unchanged with None."""
    match = re.fullmatch(r"(.+)_w(\d+)", name)
    if match is None or match.group(1) not in _WIDTH_MODELS:
        return name, None
    width = int(match.group(2))
    if width < 1:
        raise ConfigError(f"model width must be >= 1, got {name!r}.")
    return match.group(1), width


_WIDTH_MODELS = ("mnist1d_mlp", "mnist1d_cnn", "mnist1d_lenet")


def _torchvision_model(name: str, num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    from torchvision import models

    available = models.list_models(module=models)
    if name not in available:
        raise ConfigError(f"torchvision has no classification model {name!r}; "
                          f"available: {', '.join(available)}.")
    if not input_shape or input_shape[0] != 3:
        raise ConfigError(f"torchvision model {name!r} expects 3-channel images, but the inputs are "
                          f"shaped {input_shape}; use a zoo model ({', '.join(MODELS)}) instead.")
    return models.get_model(name, weights=None, num_classes=num_classes)


def default_model(dataset: str) -> str:
    """Default zoo model for a dataset.

    The MLP for digits, the MNIST-1D paper's CNN for MNIST-1D, IMA's CNN for
    (Fashion-)MNIST, FedGuCci's CNN for CIFAR-10/100 and SVHN.
    """
    key = canonical_name(dataset)
    if key not in _DEFAULT_MODEL:  # every embedded or torchvision dataset has a default model
        raise ConfigError(unknown_dataset(dataset))
    return _DEFAULT_MODEL[key]


def classifier_name(model: nn.Module) -> str:
    """Dotted name of the model's final ``nn.Linear`` (the last one registered)."""
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not names:
        raise ConfigError(f"{type(model).__name__} has no nn.Linear layer to act as its classifier.")
    return names[-1]
