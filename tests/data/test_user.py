"""A data set of the user's own (mpi_train/data/user.py): the contract kept, the class count and shape reaching the
model, the DataLoader path, and one paragraph naming what was expected for each way of breaking it, in one process."""

import textwrap

import pytest
import torch

from mpi_train.cluster import Cluster
from mpi_train.config import TrainConfig
from mpi_train.data import load_datasets, make_loaders
from mpi_train.data import user as user_data
from mpi_train.errors import UserError
from mpi_train.models import check, resolve

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def cluster():
    return Cluster.from_mpi()


@pytest.fixture
def users_data(tmp_path, monkeypatch):
    """A module of the user's own on sys.path: a data set that keeps the contract, and ones that break it."""
    (tmp_path / "my_data.py").write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import Dataset, IterableDataset, TensorDataset

        def pictures(count, classes=4, shape=(1, 12, 10), dtype=torch.float32, first_label=0):
            images = (torch.arange(count * 120, dtype=torch.float32).reshape(count, *shape) / 100).to(dtype)
            return TensorDataset(images, (torch.arange(count) + first_label) % classes)

        def load(data_dir):
            return pictures(24), pictures(8), 4

        def fixed():
            return pictures(8), pictures(4), 4

        def raises(data_dir):
            raise FileNotFoundError(f"no {data_dir}/labels.csv")

        def one_split(data_dir):
            return pictures(8)

        class Stream(IterableDataset):
            def __iter__(self):
                yield torch.zeros(1, 12, 10), 0

        def streamed(data_dir):
            return Stream(), pictures(4), 4

        def empty(data_dir):
            return pictures(0), pictures(4), 4

        def bytes_images(data_dir):
            return pictures(8, dtype=torch.uint8), pictures(4, dtype=torch.uint8), 4

        def double_images(data_dir):  # torch.from_numpy of a numpy float array
            return pictures(8, dtype=torch.float64), pictures(4, dtype=torch.float64), 4

        def one_class(data_dir):
            return pictures(8, classes=1), pictures(4, classes=1), 1

        def out_of_range(data_dir):
            return pictures(8, classes=6, first_label=5), pictures(4), 4

        def one_hot(data_dir):
            train = pictures(8)
            return TensorDataset(train.tensors[0], torch.eye(4)[train.tensors[1]]), pictures(4), 4

        def other_shapes(data_dir):
            return pictures(8), pictures(4, shape=(1, 10, 12)), 4

        def no_count(data_dir):
            return pictures(8), pictures(4), "4"

        class Flaky(Dataset):
            def __len__(self):
                return 8

            def __getitem__(self, index):
                if index == 5:
                    raise KeyError("row 5")
                return torch.zeros(1, 12, 10), index % 2

        def flaky(data_dir):
            return Flaky(), pictures(4, classes=2), 2

        class Later(Dataset):  # kept at item 0; item 3 breaks the contract as `fault` says
            def __init__(self, fault):
                self.fault = fault

            def __len__(self):
                return 8

            def __getitem__(self, index):
                if index == 3 and self.fault == "label":
                    return torch.zeros(1, 12, 10), 7
                if index == 3 and self.fault == "shape":
                    return torch.zeros(1, 10, 12), 1
                return torch.zeros(1, 12, 10), index % 2

        def late_label(data_dir):
            return Later("label"), pictures(4, classes=2), 2

        def late_shape(data_dir):
            return Later("shape"), pictures(4, classes=2), 2

        def build(num_classes):
            return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(120, num_classes))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    user_data.load.cache_clear()
    resolve.cache_clear()
    check.cache_clear()


def test_the_contract_gives_the_model_its_classes_and_shape(users_data, tmp_path):
    config = TrainConfig(dataset="my_data:load", data_dir=str(tmp_path), model="my_data:build")
    config.validate(world_size=2)
    assert config.data_spec == ((1, 12, 10), 4) and config.input_shape == (1, 12, 10)
    assert config.make_model()(torch.zeros(2, 1, 12, 10)).shape == (2, 4)
    assert TrainConfig(dataset="my_data:fixed", model="my_data:build").data_spec == ((1, 12, 10), 4)  # no argument
    assert TrainConfig(dataset="my_data:load").model_name == "resnet18"  # refused here: 1 channel
    with pytest.raises(UserError, match="torchvision's models take 3-channel images"):
        TrainConfig(dataset="my_data:load").validate(world_size=1)


def test_it_is_read_through_the_dataloader_in_the_seeded_order(users_data, tmp_path, cluster):
    config = TrainConfig(dataset="my_data:load", data_dir=str(tmp_path), model="my_data:build", batch_size=8)
    loaders = make_loaders(*load_datasets(config, cluster), config, cluster, CPU)
    assert loaders.path == "dataloader"
    batches = list(loaders.train)
    assert [len(labels) for _, labels in batches] == [8, 8, 8] and batches[0][0].shape == (8, 1, 12, 10)
    assert sorted(label for _, labels in batches for label in labels.tolist()) == sorted([i % 4 for i in range(24)])
    with pytest.raises(UserError, match="--loader resident holds a decoded copy .* Drop --loader"):
        make_loaders(*load_datasets(config, cluster), TrainConfig(**{**config.__dict__, "loader": "resident"}),
                     cluster, CPU)


def test_an_item_that_raises_mid_epoch_is_named_by_its_batch(users_data, tmp_path, cluster):
    config = TrainConfig(dataset="my_data:flaky", model="my_data:build", batch_size=4)
    loaders = make_loaders(*load_datasets(config, cluster), config, cluster, CPU)
    with pytest.raises(UserError) as error:
        for _ in loaders.train:
            pass
    message = str(error.value)
    assert message.startswith("--dataset my_data:flaky: its training set's item 5 raised KeyError: 'row 5'. Run ")
    assert not error.value.collective


@pytest.mark.parametrize("path,words", [
    ("my_data:late_label", "its training set's item 3 has the label 7, not an int in [0, 2) (its num_classes). Run "),
    ("my_data:late_shape", ("its training set's item 3 has an image of shape (1, 10, 12), where item 0's is (1, 12, "
                            "10): a batch stacks images of one shape. Run ")),
])
def test_an_item_past_the_first_that_breaks_the_contract_is_named_by_its_batch(users_data, cluster, path, words):
    # a label out of range would stop a CUDA kernel with a device-side assert; an image of another shape, the stacking
    config = TrainConfig(dataset=path, model="my_data:build", batch_size=4)
    loaders = make_loaders(*load_datasets(config, cluster), config, cluster, CPU)
    with pytest.raises(UserError) as error:
        for _ in loaders.train:
            pass
    assert str(error.value).startswith(f"--dataset {path}: ") and words in str(error.value)


@pytest.mark.parametrize("path,words", [
    ("no_such_module:load", "--dataset no_such_module:load: importing no_such_module failed (ModuleNotFoundError"),
    ("my_data:missing", "--dataset my_data:missing: my_data has no attribute missing"),
    ("my_data:raises", ("--dataset my_data:raises: calling it as raises('data') raised FileNotFoundError: no "
                        "data/labels.csv")),
    ("my_data:one_split", "returned a torch.utils.data.dataset.TensorDataset, not (train, test, num_classes)"),
    ("my_data:streamed", "returned as its training set a my_data.Stream, not a map-style data set"),
    ("my_data:empty", "returned an empty training set"),
    ("my_data:bytes_images", ("item 0's image is a torch.uint8 tensor of shape (1, 12, 10), not a float32 tensor "
                              "(channels, height, width) (pixels of 0 to 255: return image.float() / 255)")),
    ("my_data:double_images", ("item 0's image is a torch.float64 tensor of shape (1, 12, 10), not a float32 tensor "
                               "(channels, height, width) (the model's weights are float32, which a float64 or "
                               "float16 input does not meet: return image.float())")),
    ("my_data:one_class", "returned 1 as its class count: a classifier of one class scores 100% having learnt"),
    ("my_data:out_of_range", "returned a training set whose item 0's label is 5, not an int in [0, 4)"),
    ("my_data:one_hot", ("item 0's label is tensor([1., 0., 0., 0.]), not an int in [0, 4): a one-hot vector, "
                         "whose class is label.argmax()")),
    ("my_data:other_shapes", "returned training images of shape (1, 12, 10) and test images of shape (1, 10, 12)"),
    ("my_data:no_count", "returned '4' as its class count, not a positive int"),
])
def test_a_data_set_that_breaks_the_contract_is_one_paragraph_naming_what_was_expected(users_data, path, words):
    with pytest.raises(UserError) as error:
        TrainConfig(dataset=path, model="my_data:build").validate(world_size=1)
    message = str(error.value)
    assert words in message and "\n" not in message
    assert "returns (train, test, num_classes): two map-style data sets" in message  # the contract, each time


def test_an_unknown_name_lists_the_data_sets_and_the_form_of_ones_own():
    with pytest.raises(UserError) as error:
        TrainConfig(dataset="imagenet").validate(world_size=1)
    message = str(error.value)
    assert "--dataset imagenet is not a data set this tool reads: cifar10, mnist, text, synthetic, imagefolder" in (
        message)
    assert "MODULE:FUNCTION" in message
