"""Finding where a key of a TOML text is set, so that a mistake names its line."""

from mpi_train.lab.toml_lines import key_label, locate


def test_locate_finds_keys_in_array_tables_and_their_sub_tables():
    text = '[[sweep]]\nsync = "a"\n[[sweep]]\nsync = "b"\n[sweep.env]\nX = "1"\n[train]\n"lr" = 1\n'
    assert locate(text, ("sweep", 1, "sync")) == 4
    assert locate(text, ("sweep", 1, "env", "X")) == 6
    assert locate(text, ("train", "lr")) == 8
    assert locate(text, ("sweep", 0, "np")) == 1  # not set: its table's line


def test_a_key_is_labelled_as_the_user_counts_tables():
    assert key_label(("sweep", 1, "env", "X")) == "sweep[2].env.X"
    assert key_label(("train",)) == "train"
