import torch

from mpi_train.models import INPUT_SHAPES, build_model


def count(model):
    return sum(p.numel() for p in model.parameters())


def test_vgg11_matches_the_reference_size_and_output():
    model = build_model("vgg11")
    assert count(model) == 9_231_114
    assert model(torch.zeros(2, *INPUT_SHAPES["vgg11"])).shape == (2, 10)


def test_mnist_cnn_is_the_classic_example_net():
    model = build_model("mnist_cnn")
    assert count(model) == 1_199_882
    assert model(torch.zeros(2, *INPUT_SHAPES["mnist_cnn"])).shape == (2, 10)


def test_dropout_override_reaches_every_dropout_layer():
    model = build_model("mnist_cnn", dropout=0.0)
    assert [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)] == [0.0, 0.0]
