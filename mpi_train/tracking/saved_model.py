"""--save-model: the trained model as an MLflow PyTorch model of the job's run, one that loads with torch alone where
torch.export can trace it."""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from pathlib import Path

from ..models import example, resolve
from .spool import OFFLINE_PREFIX, first_line
from .store_writes import store_said


def save_model_files(model, inputs, path: Path, run_id: str | None) -> str:
    """`model` saved as an MLflow PyTorch model at `path` with `inputs` (a numpy batch) as its input example: a
    torch.export program (pt2, MLflow's default: it loads with torch alone and unpickles nothing), else, for a model
    torch.export cannot trace, pickled, which loads only where the model's code imports. The format used."""
    import mlflow.pytorch
    from mlflow.models import Model

    # listed, not inferred: inferring them loads the model again in a new Python process, seconds for nothing
    options = {"input_example": inputs, "pip_requirements": mlflow.pytorch.get_default_pip_requirements()}
    try:
        mlflow.pytorch.save_model(model, str(path), mlflow_model=Model(run_id=run_id), serialization_format="pt2",
                                  **options)
        return "pt2"
    except Exception as error:  # noqa: BLE001 - whatever torch.export cannot trace in the model's forward
        shutil.rmtree(path, ignore_errors=True)
        print(f"mpi_train: warning: torch.export cannot trace the model ({first_line(error)}); it is saved pickled "
              f"instead, which loads only where {type(model).__module__} imports.", file=sys.stderr, flush=True)
    mlflow.pytorch.save_model(model, str(path), mlflow_model=Model(run_id=run_id), serialization_format="pickle",
                              **options)
    return "pickle"


class ModelSaving:
    """MlflowTracker's part that logs the trained model (it sets `client`, `config`, `uri`, `parent_id` and
    `experiment_id`)."""

    MODEL_NAME = "model"  # what --save-model logs: runs:/<run id>/model loads it
    EXAMPLE_BATCH = 2  # samples in the model's input example: more than one, so the saved model takes any batch size

    def save_weights(self, state: dict) -> str | None:
        """The trained model as an MLflow PyTorch model, which mlflow.pytorch.load_model("runs:/<run id>/model") loads
        and the Model Registry takes: the job's model built afresh with `state` (its whole state_dict on CPU,
        SyncMethod.save's "model"), in eval mode, with an input example of the data's shape (whence its signature).
        It is a logged model of the job's run; a server that is away, or cannot take logged models (MLflow 2), gets
        the same files as the run's artifacts under model/, sent or spooled like any artifact, which the same URI
        loads once they are on the server. The code that loads it now, if it can be (not while spooled)."""
        import torch

        with torch.random.fork_rng(devices=[]):  # building draws initial weights: the job's streams stay as they were
            model = self.config.make_model()
        model.load_state_dict(state)
        inputs = example(resolve(self.config.model_name), self.config.input_shape, self.EXAMPLE_BATCH)[0]
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / self.MODEL_NAME
            # a run made offline gets its server's id from the replay: the files cannot name it
            offline = self.parent_id.startswith(OFFLINE_PREFIX)
            save_model_files(model.eval(), inputs.numpy(), path, None if offline else self.parent_id)
            uri = f"runs:/{self.parent_id}/{self.MODEL_NAME}"
            up = self._server_up()
            refused = self._log_model(path) if up else None
            if up and refused is None:
                return self.loading_code(uri)
            dropped = getattr(self.client, "dropped", 0)  # a database store's refused writes (store_writes.py)
            for file in sorted(found for found in path.rglob("*") if found.is_file()):  # sent, or spooled
                self.client.log_artifact(self.parent_id, str(file),
                                         str(self.MODEL_NAME / file.parent.relative_to(path)))
            if getattr(self.client, "dropped", 0) > dropped:
                print(f"mpi_train: warning: the MLflow store did not take the trained model ({refused}); it is not "
                      f"saved.", file=sys.stderr, flush=True)
                return None
            if refused:
                print(f"mpi_train: warning: MLflow did not take the trained model as a logged model of run "
                      f"{self.parent_id} ({refused}); it is stored with the run's artifacts under {self.MODEL_NAME}/ "
                      f"instead, which mlflow.pytorch.load_model(\"{uri}\") loads as well.", file=sys.stderr,
                      flush=True)
            if self._server_up():
                return self.loading_code(uri)
            print("mpi_train: trained model spooled with the run's other writes: once `python -m mpi_train replay` has "
                  "sent them, mlflow.pytorch.load_model(\"runs:/<run id>/model\") loads it (the replay names the run "
                  "ids it created).", flush=True)
            return None

    def loading_code(self, model_uri: str) -> str:
        """The calls that load the model from any folder: MLflow's own default store is not this tool's (./mlflow.db,
        not ./mlruns/mlflow.db), and a relative SQLite path holds in the job's folder only. No password is printed:
        a server's credentials are left to $MLFLOW_TRACKING_USERNAME and $MLFLOW_TRACKING_PASSWORD."""
        store = self.uri
        if store.startswith("sqlite:///") and not store.startswith("sqlite:////"):
            store = f"sqlite:///{Path(store.removeprefix('sqlite:///')).resolve()}"
        scheme, _, rest = store.partition("://")
        if "@" in rest.split("/", 1)[0]:  # a server's credentials: MLflow takes them from its variables instead
            store = f"{scheme}://{rest.split('@', 1)[1]}"
        return f'mlflow.set_tracking_uri("{store}"); mlflow.pytorch.load_model("{model_uri}")'

    def _server_up(self) -> bool:
        """Writes reach the store now: the job did not train offline, and no outage is being spooled."""
        return self.experiment_id is not None and not getattr(self.client, "down", False)

    def _log_model(self, path: Path) -> str | None:
        """The MLflow model saved at `path` logged as a model of the job's run (MLflow 3's LoggedModel, listed with
        the run's params in the experiment's Models tab): None once logged, else why the store did not take it."""
        from mlflow.entities import LoggedModelOutput, LoggedModelStatus
        from mlflow.models import Model

        logged = None
        try:
            logged = self.client.create_logged_model(self.experiment_id, self.MODEL_NAME, self.parent_id,
                                                     params=self.client.get_run(self.parent_id).data.params)
            saved = Model.load(str(path))  # as mlflow.pytorch.log_model writes it: the MLmodel names its model
            saved.model_id = saved.model_uuid = logged.model_id
            saved.artifact_path = logged.artifact_location
            saved.save(str(path / "MLmodel"))
            self.client.log_model_artifacts(logged.model_id, str(path))
            self.client.log_outputs(self.parent_id, [LoggedModelOutput(logged.model_id, step=0)])
            self.client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
            return None
        except Exception as error:  # noqa: BLE001 - the run's artifacts take the files instead
            if logged is not None:
                with contextlib.suppress(Exception):
                    self.client.finalize_logged_model(logged.model_id, LoggedModelStatus.FAILED)
            return store_said(error)
