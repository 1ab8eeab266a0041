"""fl.models: shapes on digits- and CIFAR-shaped inputs, architecture facts, seeding, errors."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from fl.models import MODELS, build_model, classifier_name, default_model
from landscape import ConfigError

DIGITS, CIFAR, MNIST = (1, 8, 8), (3, 32, 32), (1, 28, 28)
SMALL = [m for m in MODELS if m not in ("resnet18_gn", "ima_digit_cnn",  # the two 11M+ models
                                        "mnist1d_cnn", "mnist1d_lenet")]  # 1-D signals only (tested below)
SIGNAL = (1, 40)


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", SMALL)
@pytest.mark.parametrize("shape", [DIGITS, CIFAR, MNIST])
def test_output_shapes(name, shape):
    model = build_model(name, num_classes=7, input_shape=shape)
    out = model(torch.randn(3, *shape, generator=torch.Generator().manual_seed(0)))
    assert out.shape == (3, 7) and torch.isfinite(out).all()
    assert classifier_name(model) == "classifier"
    assert model.get_submodule(classifier_name(model)).out_features == 7


def test_resnet18_gn_cheaply():
    model = build_model("resnet18_gn", num_classes=10, input_shape=DIGITS)
    assert model(torch.zeros(2, *DIGITS)).shape == (2, 10)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert len(norms) == 1 + 8 * 2 + 3 and all(m.num_groups == 2 for m in norms)  # stem, 8 blocks, 3 projections
    assert model.projector[0].out_features == 128 and model.classifier.in_features == 128
    # torchvision's ResNet-18 backbone has 11,176,512 parameters; a 3x3 stem on 1 channel has
    # 9 * 64 instead of 49 * 3 * 64 weights; then the 512->128 projector and 128->10 classifier
    assert _count(model) == 11_176_512 - 49 * 3 * 64 + 9 * 64 + 512 * 128 + 128 + 128 * 10 + 10


def test_resnet20_parameter_count_matches_he_et_al():
    """He et al. report 0.27M parameters for the CIFAR ResNet-20; count it independently."""
    model = build_model("resnet20_bn", num_classes=10, input_shape=CIFAR)
    convs = 9 * (3 * 16 + 6 * 16 * 16                # stem, stage 1 (6 convs 16->16)
                 + 16 * 32 + 5 * 32 * 32             # stage 2: first conv from 16 channels
                 + 32 * 64 + 5 * 64 * 64)            # stage 3: first conv from 32 channels
    norms = 2 * (16 + 6 * 16 + 6 * 32 + 6 * 64)      # weight and bias of 19 BatchNorms
    assert _count(model) == convs + norms + 64 * 10 + 10 == 269_722
    # option-A shortcuts have no parameters: only convs, norms and the classifier
    kinds = {type(m) for m in model.modules() if not list(m.children())}
    assert kinds <= {nn.Conv2d, nn.BatchNorm2d, nn.Linear, nn.AdaptiveAvgPool2d, nn.Identity}


def test_groupnorm_variant_has_no_batchnorm_and_same_size():
    bn = build_model("resnet20_bn", num_classes=10, input_shape=CIFAR)
    gn = build_model("resnet20_gn", num_classes=10, input_shape=CIFAR)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in gn.modules())
    assert all(m.num_groups == 2 for m in gn.modules() if isinstance(m, nn.GroupNorm))
    assert _count(gn) == _count(bn) and not list(gn.buffers())
    assert len(list(bn.buffers())) == 19 * 3  # running mean, var and batch count per BatchNorm


def test_paper_layer_sizes():
    fedgucci = build_model("fedgucci_cnn", num_classes=10, input_shape=CIFAR)
    assert fedgucci.head[1].in_features == 1024 and fedgucci.head[1].out_features == 64  # 64*4*4
    floco = build_model("floco_cnn", num_classes=10, input_shape=CIFAR)
    assert floco.head[1].in_features == 576 and floco.classifier.in_features == 128  # 64*3*3
    assert any(isinstance(m, nn.LeakyReLU) for m in floco.modules())
    ima_c = build_model("ima_cnn", num_classes=10, input_shape=CIFAR)
    assert [layer.in_features for layer in ima_c.modules() if isinstance(layer, nn.Linear)] == [1600, 384, 128]
    ima_f = build_model("ima_cnn", num_classes=10, input_shape=MNIST)
    assert [layer.in_features for layer in ima_f.modules() if isinstance(layer, nn.Linear)] == [512, 384, 128]
    digit = build_model("ima_digit_cnn", num_classes=10, input_shape=(3, 28, 28))
    assert [layer.in_features for layer in digit.modules() if isinstance(layer, nn.Linear)] == [6272, 2048, 128]
    gns = [m for m in digit.modules() if isinstance(m, nn.GroupNorm)]
    assert len(gns) == 3 and all(m.num_groups == 2 for m in gns)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in digit.modules())
    small = build_model("ima_digit_cnn", num_classes=10, input_shape=DIGITS)  # 8 -> 4 -> 2: flatten 512
    assert small.head[1].in_features == 512 and small(torch.zeros(2, *DIGITS)).shape == (2, 10)
    mlp = build_model("mlp", num_classes=10, input_shape=DIGITS)
    assert [(layer.in_features, layer.out_features) for layer in mlp.modules() if isinstance(layer, nn.Linear)] == \
        [(64, 64), (64, 64), (64, 10)]


def test_small_inputs_are_upsampled_not_reshaped_layers():
    """On 8x8 digits the CNN layers keep the paper's kernel sizes; only the input is resized."""
    model = build_model("floco_cnn", num_classes=10, input_shape=DIGITS)
    x = torch.rand(2, *DIGITS, generator=torch.Generator().manual_seed(1))
    big = torch.nn.functional.interpolate(x, size=(16, 16), mode="bilinear", align_corners=False)
    torch.testing.assert_close(model(x), model(big))
    assert [m.kernel_size for m in model.modules() if isinstance(m, nn.Conv2d)] == [(5, 5), (5, 5), (3, 3)]


@pytest.mark.parametrize("name", SMALL + ["tv:mobilenet_v3_small"])
def test_seeded_init_is_deterministic_and_leaves_global_rng(name):
    shape = CIFAR
    before = torch.random.get_rng_state()
    a = build_model(name, num_classes=10, input_shape=shape, seed=3)
    b = build_model(name, num_classes=10, input_shape=shape, seed=3)
    assert torch.equal(torch.random.get_rng_state(), before)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
    if name in ("mlp", "floco_cnn"):
        c = build_model(name, num_classes=10, input_shape=shape, seed=4)
        assert not torch.equal(a.classifier.weight, c.classifier.weight)


def test_floco_init_is_xavier_normal_with_zero_bias():
    model = build_model("floco_cnn", num_classes=10, input_shape=CIFAR, seed=0)
    w = model.head[1].weight  # 128 x 576: std should be sqrt(2 / (576 + 128))
    assert abs(w.std().item() / (2 / (576 + 128)) ** 0.5 - 1) < 0.02
    assert all(torch.count_nonzero(m.bias) == 0 for m in model.modules() if isinstance(m, nn.Linear))


def test_torchvision_models_by_name():
    model = build_model("tv:resnet18", num_classes=5, input_shape=CIFAR)
    assert classifier_name(model) == "fc" and model.fc.out_features == 5
    assert model(torch.zeros(2, *CIFAR)).shape == (2, 5)
    assert classifier_name(build_model("tv:mobilenet_v3_small", num_classes=4,
                                       input_shape=CIFAR)) == "classifier.3"
    with pytest.raises(ConfigError, match="3-channel"):
        build_model("tv:resnet18", num_classes=10, input_shape=DIGITS)
    with pytest.raises(ConfigError, match="no classification model 'resnet9000'"):
        build_model("tv:resnet9000", num_classes=10, input_shape=CIFAR)


def test_user_modules_and_factories():
    user = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    copy = build_model(user, num_classes=10, input_shape=DIGITS)
    assert copy is not user and torch.equal(copy[1].weight, user[1].weight)
    copy[1].weight.data.zero_()
    assert torch.count_nonzero(user[1].weight) > 0
    before = torch.random.get_rng_state()
    f1 = build_model(lambda: nn.Linear(4, 2), num_classes=2, input_shape=(4,), seed=9)
    f2 = build_model(lambda: nn.Linear(4, 2), num_classes=2, input_shape=(4,), seed=9)
    assert torch.equal(f1.weight, f2.weight) and torch.equal(torch.random.get_rng_state(), before)
    with pytest.raises(ConfigError, match="not an nn.Module"):
        build_model(lambda: 3, num_classes=2, input_shape=(4,))


def test_errors_and_defaults():
    with pytest.raises(ConfigError, match="unknown model 'vgg99'.*resnet20_bn"):
        build_model("vgg99", num_classes=10, input_shape=CIFAR)
    with pytest.raises(ConfigError, match="no nn.Linear"):
        classifier_name(nn.Conv2d(1, 1, 1))
    assert default_model("digits") == "mlp" and default_model("FMNIST") == default_model("fashionmnist")
    for ds, shape in (("mnist", MNIST), ("fashionmnist", MNIST), ("cifar10", CIFAR), ("cifar100", CIFAR)):
        name = default_model(ds)
        assert name in MODELS and name != "mlp"
        assert build_model(name, num_classes=10, input_shape=shape)(torch.zeros(1, *shape)).shape == (1, 10)
    with pytest.raises(ConfigError, match="unknown dataset"):
        default_model("imagenet")


@pytest.mark.parametrize("width", [100, 7])
def test_mnist1d_mlp_parameter_count_and_residual(width):
    name = "mnist1d_mlp" if width == 100 else f"mnist1d_mlp_w{width}"
    model = build_model(name, num_classes=10, input_shape=SIGNAL, seed=3)
    # W1 (40w + w), W2 (w^2 + w), classifier (10w + 10): w^2 + 52w + 10; 15,210 for the paper's w = 100
    assert _count(model) == width ** 2 + 52 * width + 10
    assert model.linear2.in_features == model.linear2.out_features == width
    x = torch.randn(5, *SIGNAL, generator=torch.Generator().manual_seed(1))
    h1 = torch.relu(x.flatten(1) @ model.linear1.weight.T + model.linear1.bias)
    h2 = h1 + torch.relu(h1 @ model.linear2.weight.T + model.linear2.bias)
    torch.testing.assert_close(model(x), h2 @ model.classifier.weight.T + model.classifier.bias)


@pytest.mark.parametrize("width", [25, 4])
def test_mnist1d_cnn_shapes_and_parameter_count(width):
    name = "mnist1d_cnn" if width == 25 else f"mnist1d_cnn_w{width}"
    model = build_model(name, num_classes=10, input_shape=SIGNAL)
    # conv5 (5w + w), two conv3 (3w^2 + w each), classifier (5w * 10 + 10) on lengths 40 -> 19 -> 10 -> 5
    assert _count(model) == 6 * width ** 2 + 58 * width + 10  # 5,210 for the paper's 25 channels
    assert model.classifier.in_features == 5 * width and classifier_name(model) == "classifier"
    assert model(torch.zeros(3, *SIGNAL)).shape == (3, 10)
    assert default_model("mnist1d") == "mnist1d_cnn" and default_model("MNIST-1D") == "mnist1d_cnn"
    with pytest.raises(ConfigError, match="signals shaped"):
        build_model("mnist1d_cnn", num_classes=10, input_shape=DIGITS)
    with pytest.raises(ConfigError, match="unknown model"):
        build_model("mlp_w5", num_classes=10, input_shape=SIGNAL)  # the digits MLP has no width option
