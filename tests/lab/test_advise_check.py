"""The advisor's check on test hosts: its row per setting and its verdicts, from an advice with a full bench; bad
input refused before any host comes up."""

import pytest

from mpi_train.lab import advise_check
from mpi_train.lab.network import NetworkSetting


def advice(recommended: str, steps: dict[str, float], predicted_order: list[str]) -> dict:
    rows = [{"label": label, "measured_step_s": step} for label, step in sorted(steps.items(), key=lambda kv: kv[1])]
    return {"recommended": {"label": recommended}, "advise_s": 100.0,
            "full_bench": {"configurations": rows, "fastest": rows[0]["label"],
                           "regret": steps[recommended] / rows[0]["measured_step_s"] - 1, "seconds": 400.0,
                           "kendall_tau": 0.5, "kendall_tau_methods": 0.8 if predicted_order[0] == rows[0]["label"]
                           else 0.2, "default_bucket_step_s": steps.get("bucketed@25MB")}}


def test_a_row_per_setting_with_its_regret_and_the_targets_judged():
    steps = {"bucketed@8MB": 2.06, "ddp": 2.0, "bucketed@25MB": 2.1, "allreduce": 3.0}
    good = advise_check.row_of(NetworkSetting(2, "100mbit", 2), advice("bucketed@8MB", steps, ["ddp"]), 530.0)
    assert good["regret"] == pytest.approx(0.03) and good["advise_wall_s"] == pytest.approx(130.0)
    assert (good["fastest"], good["default_25mb_step_s"], good["ddp_step_s"]) == ("ddp", 2.1, 2.0)
    bad = advise_check.row_of(NetworkSetting(4, "1gbit", 2), advice("allreduce", steps, ["allreduce"]), 900.0)
    text = advise_check.table([good, bad])
    assert "h2x2-100mbit" in text and "+3.0%" in text and "+50.0%" in text
    judged = advise_check.verdicts([good, bad])
    assert judged[0] == ("h2x2-100mbit: regret met, tau met, speed met (130 s from mpirun's start to its end, 100 s "
                         "of it after start-up; the full bench took 400 s more)")
    assert judged[1] == "h4x2-1gbit: regret MISSED, tau MISSED"  # the speed target is for 2 hosts at 100 Mbit/s


def test_a_setting_of_one_host_is_refused(capsys):
    assert advise_check.main(["--hosts", "1,2"]) == 2
    assert "each setting needs at least 2 test hosts" in capsys.readouterr().err
