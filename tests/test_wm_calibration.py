"""Variance recalibration on out-of-sample residuals, and the AutoResearch WM's certain failures."""

import numpy as np
import pytest

from wmrl.domains.autoresearch.world_model import static_failure
from wmrl.world_models.calibration import VarianceCalibrator


def test_overconfident_variances_are_scaled_until_80_percent_intervals_cover_80_percent():
    rng = np.random.default_rng(0)
    cal = VarianceCalibrator(level=0.8)
    true_sd, stated_sd = 0.2, 0.1  # the model claims half the spread it has
    mean = rng.uniform(0.2, 0.8, 4000)
    real = mean + true_sd * rng.normal(size=4000)
    assert cal.scale == 1.0  # nothing seen: trust the model
    cal.observe(mean[:500], np.full(500, stated_sd**2), real[:500])
    assert cal.scale == pytest.approx((true_sd / stated_sd) ** 2, rel=0.2)
    sd = np.sqrt(cal.apply(np.full(3500, stated_sd**2)))
    covered = np.mean(np.abs(real[500:] - mean[500:]) <= 1.2816 * sd)
    assert 0.75 < covered < 0.85
    clone = VarianceCalibrator(level=0.8)
    clone.load_state_dict(cal.state_dict())
    assert clone.scale == cal.scale


def test_static_failures_are_the_ones_the_sandbox_would_report():
    ok = "import pandas as pd\nfrom sklearn.linear_model import LogisticRegression\nclf = LogisticRegression()\nprint(len(pd.__name__))\n"
    assert static_failure(ok) is None
    assert static_failure(None) == "no code block"
    assert static_failure("x = (1,\n").startswith("SyntaxError")
    missing = "import pandas as pd\nclf = LogisticRegression()\n"
    assert static_failure(missing) == "NameError: name 'LogisticRegression' is not defined"
    # names bound by assignment, loops, comprehensions, functions, handlers and imports all count as defined
    bound = ("import numpy as np\nfor i in range(3):\n    pass\nsq = [j * j for j in range(i)]\n"
             "def f(a, *b, **c):\n    return a\ntry:\n    f(sq)\nexcept ValueError as e:\n    print(e, np)\n")
    assert static_failure(bound) is None


def test_a_classifier_on_a_continuous_target_is_a_certain_failure_for_that_task_only():
    from types import SimpleNamespace

    code = "import pandas as pd\nfrom sklearn.ensemble import RandomForestClassifier\nm = RandomForestClassifier(n_estimators=5)\n"
    regression = SimpleNamespace(task_type="regression", metric="r2")
    multi_reg = SimpleNamespace(task_type="multi-output", metric="rmse")
    classification = SimpleNamespace(task_type="multiclass", metric="accuracy")
    assert static_failure(code, regression).startswith("ValueError: Unknown label type")
    assert static_failure(code, multi_reg) is not None
    assert static_failure(code, classification) is None and static_failure(code) is None
    assert static_failure(code.replace("Classifier", "Regressor"), regression) is None
