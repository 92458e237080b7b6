"""When backward has each gradient ready, as the backward clock's hooks see it."""

from mpi_train.benchmark.clocks import BackwardClock


def test_the_backward_clock_sees_the_last_layer_s_gradients_first():
    import time

    import torch
    import torch.nn.functional as F

    from mpi_train.models import build_model

    torch.manual_seed(0)
    model = build_model("mnist_cnn")
    clock = BackwardClock(model, time.perf_counter)
    images, labels = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(images), labels)
        start = time.perf_counter()
        loss.backward()
        clock.record(start, time.perf_counter())
    profile = clock.profile(0.6)
    assert profile.share == 0.6 and len(profile.ready) == len(list(model.parameters()))
    assert all(0.0 <= share <= 1.0 for share in profile.ready)
    assert profile.ready[-1] < profile.ready[0]  # the classifier's bias long before the first convolution's weights
    assert profile.ready[0] > 0.5
