"""--save-model's files: a model torch.export cannot trace is saved pickled, and loads."""

import torch

from mpi_train.tracking.saved_model import save_model_files


class Branchy(torch.nn.Module):
    """A forward torch.export cannot trace: which way it goes depends on the data."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        y = self.linear(x)
        return y if y.sum() > 0 else -y


def test_a_model_torch_export_cannot_trace_is_saved_pickled_and_loads(tmp_path, capsys):
    import mlflow.pytorch

    model = Branchy().eval()
    assert save_model_files(model, torch.zeros(2, 4).numpy(), tmp_path / "model", "run-id") == "pickle"
    assert "torch.export cannot trace the model" in capsys.readouterr().err
    batch = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(mlflow.pytorch.load_model(str(tmp_path / "model"))(batch), model(batch))
        torch.testing.assert_close(mlflow.pytorch.load_model(str(tmp_path / "model"))(-batch), model(-batch))
