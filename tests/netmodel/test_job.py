"""What a training job predicts for its own sync: the fit behind the prediction."""

from mpi_train.config import TrainConfig
from mpi_train.netmodel import JobModel, Layout, Link, Network, predict
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
