"""Text for the GPT (mpi_train/data/text.py): the 90/10 split, each rank's seeded windows, a resumed epoch's."""

from pathlib import Path

import numpy as np
import pytest
import torch

from mpi_train.cluster import Cluster
from mpi_train.config import TrainConfig
from mpi_train.data import load_datasets, text
from mpi_train.errors import UserError

DEVICE = torch.device("cpu")


def test_a_file_or_a_folder_is_read_as_bytes(tmp_path):
    (tmp_path / "b.txt").write_text("second ")
    (tmp_path / "a.txt").write_text("first, é ")
    (tmp_path / "deeper").mkdir()
    (tmp_path / "deeper" / "c.txt").write_text("third")
    (tmp_path / ".hidden").write_text("left out")
    assert text.read_bytes(tmp_path) == "first, é second third".encode()
    assert text.read_bytes(tmp_path / "b.txt") == b"second "
    with pytest.raises(UserError, match="does not exist"):
        text.read_bytes(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"--data-dir \S+/empty, and it holds none\. Put UTF-8 text files in it"):
        text.read_bytes(tmp_path / "empty")
    (tmp_path / "empty" / ".notes").write_text("hidden")
    with pytest.raises(UserError, match="it holds none but hidden ones"):
        text.read_bytes(tmp_path / "empty")


def test_the_first_90_percent_train_and_the_last_10_validate():
    data = bytes(range(256)) * 4
    train, validation = text.splits(data, context=16, source="t")
    assert len(train) == 921 and len(validation) == 1024 - 921
    assert bytes(train.data.tolist()) + bytes(validation.data.tolist()) == data
    assert train.data.dtype == torch.uint8
    with pytest.raises(UserError, match=r"too few for --context 200.*at least 2,010"):
        text.splits(data, context=200, source="t")


def test_a_window_predicts_each_next_byte():
    data = torch.arange(100, dtype=torch.uint8)
    tokens, targets = text.windows(data, torch.tensor([0, 50]), context=4)
    assert tokens.tolist() == [[0, 1, 2, 3], [50, 51, 52, 53]]
    assert targets.tolist() == [1, 2, 3, 4, 51, 52, 53, 54]  # flattened, as the GPT's logits are


def loader(rank: int, batches: int = 5, world_size: int = 1, accumulate: int = 1,
           batch_size: int = 3) -> text.TextTrainLoader:
    data = torch.randint(0, 256, (5000,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    split = text.TextSplit(data, "t")
    return text.TextTrainLoader(split, DEVICE, context=8, batch_size=batch_size, batches=batches, seed=42, rank=rank,
                                world_size=world_size, accumulate=accumulate)


def test_windows_are_seeded_by_seed_rank_and_step():
    first, again, other = (list(loader(rank, world_size=2)) for rank in (0, 0, 1))
    assert len(first) == 5 and first[0][0].shape == (3, 8) and first[0][1].shape == (24,)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, again))
    assert not torch.equal(first[0][0], other[0][0])  # each rank its own windows
    assert not torch.equal(first[0][0], first[1][0])  # each step its own
    later = loader(0, world_size=2)
    later.sampler.set_epoch(1)
    assert not torch.equal(next(iter(later))[0], first[0][0])  # each epoch its own


def test_a_step_trains_on_the_same_windows_at_any_number_of_ranks_and_any_accumulate():
    """Text's windows were once drawn per rank and micro-batch: --reshard or --accumulate changed what a step saw."""
    def step_windows(world_size: int, accumulate: int) -> list[list[list[int]]]:
        micro = 12 // (world_size * accumulate)  # a global batch of 12 windows
        ranks = [list(loader(rank, batches=2 * accumulate, world_size=world_size, accumulate=accumulate,
                             batch_size=micro)) for rank in range(world_size)]
        return [sorted(row for shard in ranks for tokens, _ in shard[step * accumulate:(step + 1) * accumulate]
                       for row in tokens.tolist()) for step in range(2)]

    alone = step_windows(1, 1)
    assert alone[0] != alone[1]
    assert step_windows(2, 1) == alone and step_windows(4, 1) == alone and step_windows(2, 3) == alone


def test_a_resumed_epoch_draws_the_windows_the_uninterrupted_one_did():
    whole = list(loader(0))
    resumed = loader(0)
    resumed.sampler.skip_next(2 * 3)  # two micro-batches of 3 already trained on
    tail = list(resumed)
    assert len(tail) == 3 and all(torch.equal(a[0], b[0]) for a, b in zip(tail, whole[2:]))


def test_the_validation_windows_are_shared_out_once_each():
    split = text.TextSplit(torch.arange(90, dtype=torch.uint8), "t")
    shards = [text.TextTestLoader(split, DEVICE, context=10, batch_size=2, rank=rank, world_size=3)
              for rank in range(3)]
    starts = sorted(start for shard in shards for tokens, _ in shard for start in tokens[:, 0].tolist())
    assert starts == list(range(0, 80, 10))  # (90 - 1) // 10 = 8 windows, each scored by one rank


def test_synthetic_text_is_fixed_and_of_the_size_asked():
    assert text.synthetic_text(1000) == text.synthetic_text(1000)
    assert len(text.synthetic_text(1000)) == 1000 and b" " in text.synthetic_text(1000)


def test_synthetic_text_is_its_words_joined_by_spaces_across_slices(monkeypatch):
    monkeypatch.setattr(text, "SYNTHETIC_SLICE", 7)  # many slices, and a word cut at the end
    made = text.synthetic_text(1001)
    words = made.split(b" ")
    assert len(made) == 1001 and all(2 <= len(word) <= 8 for word in words[:-1]) and 1 <= len(words[-1]) <= 8
    assert made.startswith(text.synthetic_text(500)) and set(words) <= set(text.synthetic_text(100_000).split(b" "))


def test_synthetic_text_too_large_for_the_hosts_memory_is_refused_before_it_is_made():
    config = TrainConfig(dataset="synthetic", model="gpt", context=10**7)
    with pytest.raises(UserError, match=r"4,096 x 10,000,000 = 38\.15 GiB.*Lower --synthetic-size or --context"):
        load_datasets(config, Cluster.from_mpi())


def test_a_binary_file_trains_with_a_one_line_warning_and_text_without(tmp_path, capsys):
    cluster = Cluster.from_mpi()
    binary, prose = tmp_path / "weights.bin", tmp_path / "prose.txt"
    binary.write_bytes(np.random.default_rng(0).integers(0, 256, 20_000, dtype=np.uint8).tobytes())
    prose.write_text("Ça va? Très bien, merci.\n\tUne ligne de plus.\n" * 500)
    train, _ = load_datasets(TrainConfig(dataset="text", data_dir=str(binary), context=32), cluster)
    assert len(train) == 18_000  # trained on all the same
    warning = capsys.readouterr().err
    assert warning.count("\n") == 1 and warning.startswith(f"mpi_train: warning: {binary} does not look like text: ")
    assert "54% of its bytes are not UTF-8 text" in warning
    load_datasets(TrainConfig(dataset="text", data_dir=str(prose), context=32), cluster)
    assert capsys.readouterr().err == ""


def test_a_text_folder_is_read_through_its_links_and_a_link_to_nothing_is_refused(tmp_path):
    """rglob passed over linked folders: a corpus of links to the books once trained on its README alone."""
    books, corpus = tmp_path / "books", tmp_path / "corpus"
    books.mkdir()
    corpus.mkdir()
    (books / "a.txt").write_text("the book")
    (corpus / "README.txt").write_text("read me")
    (corpus / "books").symlink_to(books)
    (corpus / ".cache").mkdir()
    (corpus / ".cache" / "x.txt").write_text("hidden")
    assert text.read_bytes(corpus) == b"read me" + b"the book"  # sorted by path: README.txt before books/a.txt
    (corpus / "gone.txt").symlink_to(tmp_path / "nowhere.txt")
    with pytest.raises(UserError, match=r"holds 1 link\(s\) to no file .*gone\.txt leads to"):
        text.read_bytes(corpus)
    (corpus / "gone.txt").unlink()
    (books / "up").symlink_to(corpus)  # corpus/books/up is corpus again
    with pytest.raises(UserError, match="reached through a link"):
        text.read_bytes(corpus)


def test_a_text_folder_that_holds_the_jobs_own_outputs_is_refused(tmp_path, monkeypatch):
    """--data-dir . once read the job's own mlruns/mlflow.db as text, and each rerun its checkpoints too."""
    from mpi_train.data.sets import refuse_own_outputs

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "corpus").mkdir()
    with pytest.raises(UserError, match=r"this job writes there too \(the MLflow store mlruns, --checkpoint-dir ck\)"):
        refuse_own_outputs(Path("."), TrainConfig(dataset="text", data_dir=".", checkpoint_dir="ck"))
    refuse_own_outputs(Path("corpus"), TrainConfig(dataset="text", data_dir="corpus", checkpoint_dir="ck"))
    refuse_own_outputs(Path("."), TrainConfig(dataset="text", data_dir=".", no_tracking=True,
                                              tracking_uri="http://127.0.0.1:5000"))
