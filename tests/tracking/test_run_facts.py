"""A job's run's params: every option that changes what a job computes, or how fast, is one."""

from mpi_train.config import JobInfo, TrainConfig, field_kinds
from mpi_train.tracking.run_facts import PARAMS as RUN_PARAMS
from mpi_train.tracking.run_facts import run_params


def test_every_option_but_the_paths_and_output_switches_is_a_param():
    """Two runs that differ by any option that changes what they compute, or how fast, differ in their params."""
    unlogged = {"summary_json", "timeline_dir", "checkpoint_dir", "resume", "calibration",  # paths
                "tracking_uri", "experiment", "run_name",  # where the run is, as MLflow shows
                "no_tracking", "save_model", "tracking_spool"}  # output switches
    config = TrainConfig(sync="localsgd", overlap=True, fragments=2, dropout=0.1, gpt_layers=3, context=64,
                         loader="dataloader", deterministic=True, dataset="synthetic", synthetic_size=512,
                         bucket_mb=4.0, threads=2, run_name="x", summary_json="s.json", resume="ckpt",
                         calibration="c.json")
    job = JobInfo(world_size=2, backend="gloo", hosts=("h1", "h1"), threads=1, rendezvous="h1:1234",
                  batch_size_per_rank=128, steps_per_epoch=16, total_steps=16)
    assert {name for name in field_kinds() if name not in RUN_PARAMS} == unlogged
    params = run_params(config, job, ["h1", "h1"])
    assert {name for name in field_kinds() if name not in params and getattr(config, name) is not None} <= unlogged
    assert (params["overlap"], params["fragments"], params["dropout"], params["gpt_layers"], params["loader"],
            params["bucket_mb"], params["threads"], params["synthetic_size"]
            ) == (True, 2, 0.1, 3, "dataloader", 4.0, 1, 512)  # threads: the job's
