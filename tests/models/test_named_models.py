"""The model registry (mpi_train/models/__init__.py): built-in names, torchvision's, the user's MODULE:CALLABLE,
and the refusal of a model the data set cannot feed (one process, models built on the meta device)."""

import textwrap
import time

import pytest
import torch

from mpi_train.config import TrainConfig
from mpi_train.errors import UserError
from mpi_train.lr_schedule import MODEL_DEFAULTS, OTHER_MODELS
from mpi_train.memory import host_memory
from mpi_train.models import (
    BUILT_IN,
    NEED_LARGER,
    SQUARE_SIZES,
    build_model,
    check,
    probe_untrained,
    resolve,
    smallest_square,
    untrained_parameters,
)
from mpi_train.models.gpt import GPT_SIZES, gpt
from mpi_train.throughput import flops_per_sample


def test_built_in_and_torchvision_names_resolve_in_one_place():
    assert [resolve(name).source for name in BUILT_IN] == ["built-in"] * 3
    resnet = resolve("resnet18")
    assert (resnet.source, resnet.takes) == ("torchvision", "images")
    model = build_model("resnet18")
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_an_unknown_name_lists_what_exists():
    with pytest.raises(Exception) as error:
        resolve("resnet19")
    message = str(error.value)
    assert "--model resnet19" in message and "vgg11, mnist_cnn, gpt" in message
    assert "resnet18" in message and "mobilenet_v3_small" in message and "MODULE:CALLABLE" in message


def test_the_help_names_the_models_that_need_larger_images():
    """NEED_LARGER, which --help prints, is what a probe on the meta device finds (and a model outside it takes
    CIFAR-10's images)."""
    for name in NEED_LARGER:
        assert smallest_square(name) not in (None, 32), name
    assert smallest_square("vit_b_16") == 224 and smallest_square("alexnet") == 64
    for name in ("resnet18", "mobilenet_v3_small", "efficientnet_b0", "swin_t"):
        assert smallest_square(name) == SQUARE_SIZES[0], name


def test_a_model_the_data_cannot_feed_is_refused_at_validation_with_the_way_out():
    with pytest.raises(Exception, match=r"alexnet .*cannot take cifar10's images \(3, 32, 32\).*64x64") as error:
        TrainConfig(model="alexnet").validate(world_size=4)
    assert type(error.value).__name__ == "UserError"
    with pytest.raises(Exception, match="3-channel"):
        TrainConfig(model="resnet18", dataset="mnist").validate(world_size=4)
    with pytest.raises(Exception, match="takes images of"):
        TrainConfig(model="vgg11", dataset="mnist").validate(world_size=4)
    with pytest.raises(Exception, match="--model gpt"):
        TrainConfig(model="vgg11", dataset="text").validate(world_size=4)
    with pytest.raises(Exception, match="language model"):
        TrainConfig(model="gpt", dataset="cifar10").validate(world_size=4)


def test_synthetic_images_take_the_size_the_model_takes():
    assert TrainConfig(model="resnet18", dataset="synthetic").input_shape == (3, 32, 32)
    assert TrainConfig(model="alexnet", dataset="synthetic").input_shape == (3, 64, 64)
    assert TrainConfig(model="mnist_cnn", dataset="synthetic").input_shape == (1, 28, 28)
    assert TrainConfig(model="gpt", dataset="synthetic", context=32).input_shape == (32,)


def test_a_model_without_measured_defaults_trains_with_the_general_ones():
    assert TrainConfig(model="resnet50").optimizer_settings == OTHER_MODELS
    assert TrainConfig(model="gpt", dataset="text").optimizer_settings == MODEL_DEFAULTS["gpt"][0]


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A package of the user's own on sys.path, with a good builder and bad ones."""
    (tmp_path / "my_models.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        def build(num_classes, input_shape):
            channels, height, width = input_shape
            return nn.Sequential(nn.Flatten(), nn.Linear(channels * height * width, num_classes))

        def not_a_module(num_classes, input_shape):
            return [nn.Linear(3, num_classes)]

        def raises(num_classes, input_shape):
            raise RuntimeError("no such layer")

        def for_classes(num_classes):
            return nn.Sequential(nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.LazyLinear(num_classes))

        def ten_classes():
            return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, 10))

        class WithSpare(nn.Module):
            def __init__(self, num_classes):
                super().__init__()
                self.head, self.spare = nn.Sequential(nn.Flatten(), nn.LazyLinear(num_classes)), nn.Linear(2, 2)

            def forward(self, images):
                return self.head(images)

        def with_spare(num_classes):
            return WithSpare(num_classes)

        def frozen(num_classes, input_shape):
            return build(num_classes, input_shape).requires_grad_(False)

        class Branchy(WithSpare):
            def forward(self, images):  # an `if` on the values: the meta device, which has none, cannot run it
                return self.head(images) if images.sum() > 0 else self.head(-images)

        def branchy(num_classes):
            return Branchy(num_classes)

        def doubled(num_classes, input_shape):
            return build(num_classes, input_shape).double()

        class Broken(nn.Module):
            def __init__(self):
                super().__init__()
                self.layer = nn.Linear(3, 10)

            def forward(self, images):
                return self.layer(images.flatten(1))  # 3 * H * W features where the layer takes 3

        def broken(num_classes, input_shape):
            return Broken()

        NOT_CALLABLE = 3
    """))
    (tmp_path / "broken_models.py").write_text("import torch\nraise ImportError('needs timm')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    resolve.cache_clear()
    check.cache_clear()
    untrained_parameters.cache_clear()


def test_a_users_callable_builds_for_the_data_sets_classes_and_images(user_module):
    config = TrainConfig(model="my_models:build", dataset="cifar10", dropout=None)
    config.validate(world_size=2)
    model = config.make_model()
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert resolve("my_models:build").source == "your own"


def test_parameters_no_logit_depends_on_are_named_and_a_model_with_nothing_to_train_is_refused(user_module):
    assert TrainConfig(model="my_models:with_spare", dataset="synthetic").untrained_parameters == ("spare.weight",
                                                                                                 "spare.bias")
    for name in ("my_models:build", "vgg11", "gpt", "resnet18"):
        assert TrainConfig(model=name, dataset="synthetic").untrained_parameters == (), name
    for name, spec in BUILT_IN.items():  # what lets untrained_parameters leave the built-in models unprobed
        config = TrainConfig(model=name, dataset="synthetic")
        assert probe_untrained(spec, config.input_shape, config.gpt_shape, 10) == (), name
    with pytest.raises(UserError, match=r"^--model my_models:frozen has no parameter that requires a gradient "):
        _ = TrainConfig(model="my_models:frozen", dataset="synthetic").untrained_parameters


def test_a_forward_whose_path_its_values_decide_is_checked_and_counted_on_a_real_copy(user_module):
    """The meta device holds no values, so an `if` on a tensor once refused the model as taking no image size; and
    since zeros take one path of several, nothing is claimed untrained (another path may train it)."""
    config = TrainConfig(model="my_models:branchy", dataset="synthetic")
    config.validate(world_size=1)
    assert config.untrained_parameters == ()
    flops = flops_per_sample(config.make_model, config.input_shape)
    assert flops == 2 * 2 * 3 * 32 * 32 * 10, flops  # the head's matmul forward, and its weights' gradient


@pytest.mark.parametrize("path,words", [
    ("no_such_package.models:build", "importing no_such_package.models failed (ModuleNotFoundError"),
    ("broken_models:build", "importing broken_models failed (ImportError: needs timm)"),
    ("my_models:missing", "my_models has no attribute missing"),
    ("my_models:NOT_CALLABLE", "NOT_CALLABLE is a int, not a callable"),
    ("my_models:not_a_module", "returned builtins.list, not a torch.nn.Module"),
    ("my_models:raises", "raised RuntimeError: no such layer"),
    ("my_models:", "is not MODULE:CALLABLE"),
])
def test_a_users_callable_that_fails_is_one_paragraph_naming_the_path(user_module, path, words):
    with pytest.raises(Exception) as error:
        TrainConfig(model=path).validate(world_size=2)
    message = str(error.value)
    assert type(error.value).__name__ == "UserError"
    assert words in message and "build(num_classes, input_shape)" in message and "\n" not in message
    assert path.partition(":")[0] in message


def test_gpt_sizes_and_overrides_come_from_the_flags():
    config = TrainConfig(model="gpt", dataset="synthetic", gpt_size="small", gpt_layers=2, context=64)
    assert config.gpt_shape == GPT_SIZES["small"].__class__(layers=2, heads=6, width=384, context=64)
    with pytest.raises(Exception, match="--gpt-width 100 must split evenly across --gpt-heads 6"):
        TrainConfig(model="gpt", dataset="synthetic", gpt_size="small", gpt_width=100).validate(world_size=1)
    for size, shape in GPT_SIZES.items():  # the count the host-memory check reads, against the built model's
        assert shape.parameters == sum(p.numel() for p in gpt(shape).parameters()), size
    block_bytes = 4 * (GPT_SIZES["tiny"].parameters // GPT_SIZES["tiny"].layers)  # float32, a little over a block's
    layers = 2 * host_memory()[1] // block_bytes  # weights of about twice the host's memory
    started = time.monotonic()  # refused from the shape, before minutes of building it
    with pytest.raises(Exception, match=rf"^--model gpt of {layers} layers, .* parameters, and their float32 weights "
                                        r"alone take [\d.]+ GiB, more than this host's [\d.]+ GiB of memory") as huge:
        TrainConfig(model="gpt", dataset="synthetic", gpt_layers=layers).validate(world_size=1)
    assert type(huge.value).__name__ == "UserError" and time.monotonic() - started < 5
    with pytest.raises(Exception, match=r"^--gpt-heads shapes --model gpt, .* which would ignore it\. Drop it, or"):
        TrainConfig(model="mnist_cnn", dataset="synthetic", gpt_heads=4).validate(world_size=1)
    with pytest.raises(Exception, match=r"^--gpt-layers, --gpt-width shape --model gpt, .* ignore them\. Drop them"):
        TrainConfig(model="mnist_cnn", dataset="synthetic", gpt_layers=2, gpt_width=64).validate(world_size=1)
    with pytest.raises(Exception, match="always held resident"):
        TrainConfig(model="gpt", dataset="synthetic", loader="dataloader").validate(world_size=1)


def test_a_users_callable_gets_the_arguments_it_takes_and_its_classes_are_checked(user_module):
    tiny = GPT_SIZES["tiny"]
    assert check("my_models:for_classes", "imagefolder", (3, 40, 40), tiny, 5) == (3, 40, 40)
    assert build_model("my_models:for_classes", input_shape=(3, 40, 40), classes=5)(torch.zeros(2, 3, 40, 40)).shape \
        == (2, 5)
    with pytest.raises(Exception, match=r"^--model my_models:ten_classes \(your own\) takes imagefolder's images "
                                        r"\(3, 40, 40\), but it returned \(2, 10\): 10 logits per image, where the "
                                        r"data has 5 classes \(its last layer must give one logit per class"):
        check("my_models:ten_classes", "imagefolder", (3, 40, 40), tiny, 5)
    with pytest.raises(Exception, match=r"takes synthetic's images, but it returned \(2, 10\): 10 logits per image, "
                                        r"where the data has 5 classes"):
        check("my_models:ten_classes", "synthetic", None, tiny, 5)
    assert check("my_models:ten_classes", "cifar10", (3, 32, 32), tiny) == (3, 32, 32)
    # float64 weights pass the probe on the meta device and would fail at step 1: refused at the check, whatever
    # the images
    for dataset, shape in (("synthetic", None), ("imagefolder", (3, 40, 40))):
        with pytest.raises(UserError, match=r"^--model my_models:doubled \(your own\) has float64 parameters \(e\.g\. "
                                            r"1\.weight\), and the tool trains float32 weights\. Build the model "
                                            r"without \.double\(\)"):
            check("my_models:doubled", dataset, shape, tiny, 5)
    with pytest.raises(UserError) as error:  # images in PIL's and numpy's order
        check("resnet18", "my_data:load", (16, 16, 3), tiny, 4)
    assert str(error.value).endswith("Its images look like (height, width, channels) (PIL's and numpy's order): "
                                     "return them as (channels, height, width), e.g. image.permute(2, 0, 1). Pick a "
                                     "model that takes them (e.g. vgg11).")


def test_a_users_forward_that_raises_is_refused_naming_its_own_line_and_the_batch_to_try(user_module, tmp_path):
    tiny = GPT_SIZES["tiny"]
    lines = (tmp_path / "my_models.py").read_text().splitlines()
    line = next(number for number, text in enumerate(lines, 1) if "self.layer(images.flatten(1))" in text)
    where = rf"\(at my_models\.py line {line}, in forward\)"  # the user's line, not torch's or this package's probe
    refused = (rf"^--model my_models:broken takes none of the square images .* \(on \(2, 3, 32, 32\): RuntimeError: "
               rf".*{where}\)\. .*by hand on torch\.zeros\(2, 3, 32, 32\)")
    with pytest.raises(UserError, match=refused):
        check("my_models:broken", "synthetic", None, tiny)
    with pytest.raises(UserError, match=rf"cannot take imagefolder's images \(3, 40, 40\) .*{where}\. Make its forward "
                                        rf"map a float batch \(batch, 3, 40, 40\) to logits \(batch, 5\)"):
        check("my_models:broken", "imagefolder", (3, 40, 40), tiny, 5)


def test_the_built_in_convnets_are_built_for_other_images_and_classes():
    tiny = GPT_SIZES["tiny"]
    for name, shape in (("vgg11", (3, 40, 40)), ("vgg11", (1, 48, 36)), ("mnist_cnn", (3, 40, 40))):
        assert check(name, "imagefolder", shape, tiny, 7) == shape
        model = build_model(name, input_shape=shape, classes=7)
        assert model(torch.zeros(2, *shape)).shape == (2, 7)
    # three input channels, a first linear layer as wide as 40x40 images leave, seven classes
    assert sum(p.numel() for p in model.parameters()) == (1_199_882 + 2 * 32 * 9 + (64 * 18 * 18 - 9216) * 128
                                                           - 3 * 129)
    vgg = build_model("vgg11", input_shape=(3, 40, 40), classes=10)  # a global average pool: no weights of its own
    assert sum(p.numel() for p in vgg.parameters()) == 9_231_114
    with pytest.raises(Exception, match=r"--model mnist_cnn \(built-in\) cannot take imagefolder's images \(3, 5, 5\)"):
        check("mnist_cnn", "imagefolder", (3, 5, 5), tiny, 7)
    with pytest.raises(Exception, match="takes images of"):  # the course's pairs stay as they were
        check("vgg11", "mnist", (1, 28, 28), tiny)
