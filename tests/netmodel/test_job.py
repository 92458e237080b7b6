"""What a training job predicts for its own sync: the fit behind the prediction."""

from mpi_train.config import TrainConfig
from mpi_train.netmodel import JobModel, Layout, Link, Network, predict
from mpi_train.netmodel.job import compiled
from mpi_train.sync import build_method


def test_a_job_s_fit_error_is_the_worst_of_the_links_its_prediction_crosses():
    # the report says on its plot when this is rough: one host crosses only its own link, two hosts the slower one
    network = Network(intra=Link(10e-6, 1 / 1e9, fit_error=0.05), inter=Link(100e-6, 1 / 125e6, fit_error=0.34))
    method = build_method("allreduce", TrainConfig(sync="allreduce"))
    tensors = [1e6] * 4
    one_host, two_hosts = Layout(2, 2), Layout(4, 2)
    assert JobModel(method, predict(method, tensors, one_host, network), network, one_host, tensors).fit_error == 0.05
    assert JobModel(method, predict(method, tensors, two_hosts, network), network, two_hosts,
                    tensors).fit_error == 0.34


def test_compiled_a_method_whose_hooks_fire_at_backward_s_end_hides_none_of_its_messages_behind_it():
    network = Network(intra=Link(10e-6, 1 / 1e9), inter=Link(100e-6, 1 / 125e6))
    method = build_method("bucketed", TrainConfig(sync="bucketed", bucket_mb=1))
    tensors, layout = [1e6] * 8, Layout(2, 1)  # 8 MB in 1 MB buckets: 64 ms on the wire, backward 0.2 s
    eager = JobModel(method, predict(method, tensors, layout, network), network, layout, tensors)
    built = JobModel(method, eager.prediction, network, layout, tensors, backward=compiled(eager.backward, 8))
    assert eager.sync_time(0.3) < 0.3 * built.sync_time(0.3)  # eagerly, backward hides all but the last buckets
    assert built.sync_time(0.3) == eager.prediction.comm_s  # compiled, every bucket leaves at its end
    assert method.traits.lost_when_compiled and build_method("ddp", TrainConfig()).traits.lost_when_compiled is None
