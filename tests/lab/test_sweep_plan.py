"""A sweep's launches: the flags each run is given and the steps it is expected to take."""

from dataclasses import replace

from conftest import REPO

from mpi_train.config import TrainConfig
from mpi_train.lab.experiment_file import PlannedRun, load
from mpi_train.lab.sweep_plan import estimated_steps, run_command, train_flags


def planned(np: int = 1, **options) -> PlannedRun:
    return PlannedRun(index=1, name="run", np=np, config=TrainConfig(**options))


def test_estimated_steps_follow_the_sampler():
    assert estimated_steps(planned(dataset="synthetic", batch_size=64)) == 4096 // 64  # default size, one epoch
    assert estimated_steps(planned(np=4, dataset="synthetic", batch_size=64, max_steps=5)) == 5
    cifar = load(REPO / "experiments/compare_sync.toml").runs
    assert [estimated_steps(r) for r in cifar[:2]] == [196, 196]
    # a data set whose size the run learns only when it reads it: its --max-steps, else 0 until it prints them
    folder = replace(cifar[0], config=replace(cifar[0].config, dataset="imagefolder", max_steps=7))
    assert estimated_steps(folder) == 7 and estimated_steps(replace(folder, config=replace(folder.config,
                                                                                           max_steps=None))) == 0


def test_flags_passed_to_training_are_the_non_default_options():
    config = TrainConfig(sync="ring", dataset="synthetic", batch_size=64, lr=1.0, max_steps=5)
    flags = train_flags(config)
    assert flags[:2] == ["--sync", "ring"] and "--max-steps" in flags and "--epochs" not in flags
    assert flags[flags.index("--batch-size") + 1] == "64"
    adamw = replace(config, optimizer="adamw")
    flags = train_flags(adamw)
    assert flags[flags.index("--optimizer") + 1] == "adamw" and adamw.optimizer_settings.optimizer == "adamw"


def test_each_run_keeps_its_checkpoints_in_a_folder_of_its_own(tmp_path):
    file = tmp_path / "ck.toml"
    file.write_text('[experiment]\nname = "ck"\ntracking = false\n[train]\ndataset = "synthetic"\nmax_steps = 4\n'
                    'checkpoint_dir = "ck"\n[[sweep]]\nsync = ["allreduce", "ddp"]\nnp = [2]\n')
    sweep = load(file)
    commands = [run_command(sweep, run, None, tmp_path / f"{run.name}.json") for run in sweep.runs]
    folders = [command[command.index("--checkpoint-dir") + 1] for command in commands]
    assert folders == ["ck/allreduce-np2-seed42", "ck/ddp-np2-seed42"]
    plain = replace(sweep.runs[0], config=replace(sweep.runs[0].config, checkpoint_dir=None))
    assert "--checkpoint-dir" not in run_command(sweep, plain, None, tmp_path / "s.json")
