"""The comparison's plots say on their face what a reader must know: a model's rough fit."""

from mpi_train.analysis.compare_plots import (
    plot_predictions,
    plot_sync_costs,
    prediction_points,
    predictions_figure,
    sync_costs_figure,
)


def test_the_prediction_plot_says_on_its_face_when_the_model_fits_badly(tmp_path):
    import matplotlib.pyplot as plt
    from PIL import Image

    def rows(fit):
        return [{"sync": "flat", "measured_s": 0.0157, "predicted_s": 0.0022, "hidden": False, "noisy": False,
                 "fit_error": fit},
                {"sync": "bucketed", "measured_s": 0.0014, "predicted_s": 0.0010, "hidden": False, "noisy": True,
                 "fit_error": fit}]

    def title(figure) -> str:
        text = figure.axes[0].get_title()
        plt.close(figure)
        return text

    assert "model fit error 34% (over 20%): predictions are rough" in title(predictions_figure(rows(0.34)))
    assert "not recorded" in title(predictions_figure(rows(None)))
    assert title(predictions_figure(rows(0.05))) == "Sync time: model against measurement"
    # every run ddp (its sync inside backward): no point to draw, so no plot; once empty axes titled "not recorded"
    ddp = {"sync": "ddp", "measured_s": 0.0, "predicted_s": 0.003, "hidden": True, "noisy": False, "fit_error": 0.46}
    assert prediction_points([ddp]) == [] and prediction_points([*rows(0.3), ddp]) == rows(0.3)
    path = plot_predictions(rows(0.34), tmp_path)
    assert "model fit error 34% (over 20%)" in Image.open(path).text["Title"]  # the saved PNG says it too
    bench = {"model": "mnist_cnn", "world_size": 2, "gradient_bytes": 4.8e6, "layout": {"hosts": 1},
             "calibration": {"network": {"intra": {"fit_error": 0.56}, "inter": {"fit_error": 0.9}}},
             "methods": [{"method": "ring", "collective": "ring", "sync_s": 0.01, "exposed_s": -0.002,
                          "floor_s": 0.003}]}
    assert "link fit error 56% (over 20%): floors are rough" in title(sync_costs_figure(bench))
    bench["layout"]["hosts"] = 2  # across hosts the slower fit counts
    assert "link fit error 90%" in title(sync_costs_figure(bench))
    assert "link fit error 90%" in Image.open(plot_sync_costs(bench, tmp_path)).text["Title"]

