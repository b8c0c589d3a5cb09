"""The AutoResearch default agent: its SFT corpus, the reply format, the built agent, CodeAgentPolicy.

One small agent is built per session (tmp cache, a 2-minute SFT budget) and
shared by the agent and policy tests.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import ast
import contextlib
import io
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from wmrl.domains.autoresearch.agent import AgentConfig, _cache_key, agent_info, build_default_agent, sft
from wmrl.domains.autoresearch.protocol import ASSISTANT_MARK, END_MARK, extract_code, format_prompt, format_reply, next_observation
from wmrl.domains.autoresearch.corpus import (
    TaskSpec,
    augment_description,
    generate_corpus,
    generate_script,
    script_family,
    synthetic_task,
    task_comment,
)
from wmrl.domains.autoresearch.policy import CodeAgentPolicy
from wmrl.domains.autoresearch.tasks import render_description

from conftest import BUILD, TASKS, TEST_CONFIG, make_tiny_lm  # noqa: E402 - the session's agent is built from them

# every submission shape: labels, binary and multiclass probabilities, regression, both multioutput kinds; rows
# matched by order (no id column) and the competition layout (an id column, the target's own name, class-named
# probability columns, text columns and empty cells)
SPECS = [spec for spec, _ in TASKS] + [
    TaskSpec("classification", ("label",), "roc_auc", ("p_0", "p_1", "p_2")),
    TaskSpec("classification", ("label",), "log_loss", ("p_0", "p_1")),
    TaskSpec("classification", ("colour",), "log_loss", ("p_blue", "p_green", "p_red")),  # string classes
    TaskSpec("regression", ("y",), "r2", ("prediction",)),
    TaskSpec("multioutput", ("a", "b"), "accuracy", ("a", "b")),
    TaskSpec("classification", ("churned",), "roc_auc", ("churned",), id_column="customer_id", text=True),
    TaskSpec("classification", ("species",), "log_loss", ("setosa", "versicolor", "virginica"), id_column="Id",
             missing=True),
    TaskSpec("classification", ("grade",), "macro_f1", ("grade",), id_column="id", text=True, missing=True),
    TaskSpec("regression", ("price",), "rmse", ("price",), id_column="row_id", text=True, missing=True),
    TaskSpec("multioutput", ("y1", "y2"), "r2", ("y1", "y2"), id_column="id", missing=True),
]
_WORDS = {"churned": ("no", "yes"), "grade": ("high", "low", "medium")}


def _parses(code: str | None) -> bool:
    if code is None:
        return False
    try:
        ast.parse(code)
        return True
    except (SyntaxError, ValueError):
        return False


def _dataset(spec: TaskSpec, n: int = 300, d: int = 6, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """train.csv / test_features.csv frames for a spec (class labels from its probability columns or words;
    an id column, a text column and empty cells where the spec says so)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    w = rng.normal(size=(d, len(spec.targets)))
    z = X @ w + 0.3 * rng.normal(size=(n, len(spec.targets)))
    if spec.regression:
        y = 10 * z + 50
    elif spec.multi:
        y = (z > 0).astype(int)
    else:
        names = list(_WORDS.get(spec.targets[0], ()))
        if spec.proba and not spec.positive_proba:
            names = [c[2:] if c.startswith("p_") else c for c in spec.columns]
        k = len(names) or (2 if spec.positive_proba else 3)
        y = np.digitize(z, np.quantile(z, np.linspace(0, 1, k + 1)[1:-1]))
        if names and not all(n.isdigit() for n in names):
            y = np.asarray(names, dtype=object)[y]
    cols = [f"f{i}" for i in range(d)]
    train = pd.DataFrame(X, columns=cols)
    if spec.text:
        train["region"] = np.asarray(["north", "south", "east"], dtype=object)[(X[:, 0] > 0).astype(int) + (X[:, 1] > 1)]
        cols.append("region")
    if spec.missing:
        train.loc[rng.random(n) < 0.1, "f2"] = np.nan
    if spec.id_column:
        train.insert(0, spec.id_column, 1000 + rng.permutation(n))
        cols.insert(0, spec.id_column)
    for j, t in enumerate(spec.targets):
        train[t] = y[:, j]
    cut = int(0.8 * n)
    return train.iloc[:cut].reset_index(drop=True), train.iloc[cut:][cols].reset_index(drop=True)


def _check_submission(spec: TaskSpec, path: Path, n_rows: int, train: pd.DataFrame,
                      test: pd.DataFrame) -> None:
    sub = pd.read_csv(path)
    assert len(sub) == n_rows
    assert list(sub.columns) == ([spec.id_column] if spec.id_column else []) + list(spec.columns)
    if spec.id_column:
        assert sorted(sub.pop(spec.id_column)) == sorted(test[spec.id_column])
    if spec.proba:
        p = sub.to_numpy(dtype=float)
        assert ((p >= 0) & (p <= 1)).all()
        if not spec.positive_proba:  # one probability per class, in class order
            assert np.allclose(p.sum(1), 1.0, atol=1e-4)
    assert sub.notna().all().all()
    if not spec.regression and not spec.proba:
        for col in sub.columns:
            labels = set(train[spec.targets[0] if col not in spec.targets else col].unique())
            assert set(sub[col].unique()) <= labels


# ----------------------------------------------------------------------------- corpus


def test_scripts_parse_are_deterministic_and_diverse():
    scripts = [generate_script(SPECS[i % len(SPECS)], np.random.default_rng(i)) for i in range(450)]
    assert all(_parses(s) for s in scripts)
    assert generate_script(SPECS[3], np.random.default_rng(3)) == scripts[3]
    assert len(set(scripts)) >= 0.95 * len(scripts)
    families = {script_family(s) for s in scripts}
    assert None not in families and len(families) >= 8, families
    lengths = [s.count("\n") for s in scripts]
    assert 12 <= min(lengths) and max(lengths) <= 40
    assert all('"submission.csv"' in s and 'pd.read_csv("train.csv")' in s for s in scripts)
    # the first line restates the kind of task and the metric; each import sits right before its first use
    for i, script in enumerate(scripts):
        spec, lines = SPECS[i % len(SPECS)], script.splitlines()
        assert lines[0] == task_comment(spec) and lines[0].startswith("# ")
        assert ("regression" in lines[0]) == spec.regression and ("multi-output" in lines[0]) == spec.multi
        for j, line in enumerate(lines):
            if line.startswith(("import ", "from ")):
                names = [line.split(" as ")[-1] + "."] if line.startswith("import ") else \
                    [n.strip() for n in line.split(" import ")[1].split(",")]
                code = [x for x in lines[j + 1:] if not x.startswith(("import ", "from "))]
                assert any(n in code[0] for n in names), (line, code[0], script)
                assert not any(n in x for x in lines[:j] if not x.startswith("#") for n in names), (line, script)
    # preprocessing and validation vary too
    for marker in ("StandardScaler", "MinMaxScaler", "PCA(", "SelectKBest(", "train_test_split(", "cross_val_score("):
        assert sum(marker in s for s in scripts) >= 10, marker

    corpus = generate_corpus(TASKS, 300, seed=5)
    assert corpus == generate_corpus(TASKS, 300, seed=5) and corpus != generate_corpus(TASKS, 300, seed=6)
    exact = {format_prompt(d) for _, d in TASKS}
    n_exact = sum(p in exact for p, _ in corpus)
    n_second = sum("Sandbox feedback:" in p for p, _ in corpus)
    n_synthetic = sum("- Metric: `" in p for p, _ in corpus)  # synthetic_task's format (the suite's)
    # the given tasks, verbatim (an augmented copy of these short texts, whose lines mostly name a target, a
    # submission column or the metric, is often the text itself)
    assert 0.1 * len(corpus) < n_exact < 0.5 * len(corpus), n_exact
    assert 0.05 * len(corpus) < n_second < 0.3 * len(corpus), n_second
    assert 0.35 * len(corpus) < n_synthetic < 0.65 * len(corpus), n_synthetic
    assert all(_parses(extract_code(format_reply(s))) for _, s in corpus)
    # the scripts follow their prompt's task: a regression prompt gets a regressor, every target by its name
    regression = 0
    for p, s in corpus:
        if ("Metric: rmse" in p or "Metric: `rmse`" in p or "Metric: `r2`" in p) and "Sandbox" not in p:
            regression += 1
            assert not any(c in s for c in ("Classifier", "SVC(", "LogisticRegression", "GaussianNB")), s
    assert regression >= 0.1 * len(corpus)

    # augmentation perturbs descriptions but never the lines the script depends on
    for spec, desc in TASKS:
        copies = [augment_description(desc, spec, np.random.default_rng(i)) for i in range(40)]
        assert len(set(copies)) >= 4  # (these short descriptions are mostly protected lines)
        for line in desc.splitlines():
            if any(k in line for k in (*spec.targets, *spec.columns, spec.metric)):
                assert all(line in c for c in copies), line
    kinds, targets, layouts, ids, schemas = set(), set(), set(), set(), set()
    for i in range(200):
        spec, desc = synthetic_task(np.random.default_rng(i))
        kinds.add((spec.kind, spec.metric, spec.proba))
        targets.update(spec.targets)
        # described as the suite describes its own tasks: target, metric and submission columns stated
        assert desc.startswith("# Task: ") and "## Submission" in desc and f"- Metric: `{spec.metric}`" in desc
        assert all(f"`{t}`" in desc for t in spec.targets)
        assert all(f"`{c}`" in desc.split("## Submission")[1] for c in spec.columns)
        if spec.id_column:
            assert f"`{spec.id_column}`" in desc.split("## Submission")[1]
        layouts.add((spec.id_column, *spec.columns))
        ids.add(spec.id_column)
        schemas.add((spec.text, spec.missing))
        assert _parses(generate_script(spec, np.random.default_rng(i)))
    assert {k for k, _, _ in kinds} == {"classification", "regression", "multioutput"} and len(kinds) >= 8
    assert len(targets) >= 25 and len(layouts) >= 10  # names and layouts to read, not to memorise
    assert None in ids and len(ids) >= 6 and len(schemas) == 4  # ids or not, text columns and empty cells or not
    with pytest.raises(ValueError):
        TaskSpec("classification", ("y",), "log_loss", ())  # needs its submission columns
    with pytest.raises(ValueError):
        TaskSpec("multioutput", ("a", "b"), "r2", ("a",))
    with pytest.raises(ValueError):
        TaskSpec("regression", ("y",), "accuracy", ("prediction",))


def test_prior_examples_are_fresh_draws_of_the_agents_sft_corpus():
    from wmrl.domains.autoresearch.domain import AutoResearchConfig, AutoResearchDomain

    domain = AutoResearchDomain(AutoResearchConfig())
    a = domain.prior_examples(40, [0, 1])
    assert a == domain.prior_examples(40, [0, 1]) and a != domain.prior_examples(40, [0, 2])
    assert all(p.endswith(ASSISTANT_MARK + "\n") and _parses(extract_code(r)) for p, r in a)
    assert any("- Metric: `r2`" in p or "- Metric: `rmse`" in p for p, _ in a)  # kinds RL never visits
    assert any(t.description in p for p, _ in a for t in domain.suite if t.split == "train")  # and its own tasks


def _run_in_process(script: str, workdir: Path) -> None:
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            exec(compile(script, "<script>", "exec"), {"__name__": "__main__"})
    finally:
        os.chdir(cwd)


def test_scripts_run_and_write_well_formed_submissions(tmp_path):
    # a handful for real, as the sandbox would run them: separate interpreters, in parallel
    procs = []
    for i, spec in enumerate(SPECS):
        d = tmp_path / f"real{i}"
        d.mkdir()
        train, test = _dataset(spec, seed=i)
        train.to_csv(d / "train.csv", index=False)
        test.to_csv(d / "test_features.csv", index=False)
        (d / "main.py").write_text(generate_script(spec, np.random.default_rng(1000 + i)))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        procs.append((spec, d, train, test, subprocess.Popen(
            [sys.executable, "main.py"], cwd=d, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    for spec, d, train, test, proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (spec, (d / "main.py").read_text(), err[-2000:])
        _check_submission(spec, d / "submission.csv", len(test), train, test)

    # many more in this process (same code path, no interpreter start-up)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        for i in range(len(SPECS) * 4):
            spec = SPECS[i % len(SPECS)]
            d = tmp_path / f"inproc{i}"
            d.mkdir()
            train, test = _dataset(spec, seed=100 + i)
            train.to_csv(d / "train.csv", index=False)
            test.to_csv(d / "test_features.csv", index=False)
            script = generate_script(spec, np.random.default_rng(2000 + i))
            try:
                _run_in_process(script, d)
            except Exception as exc:  # pragma: no cover - the message is the point
                raise AssertionError(f"{spec}\n{script}") from exc
            _check_submission(spec, d / "submission.csv", len(test), train, test)


def test_scripts_median_leaves_rl_room_and_the_best_reach_the_reference(tmp_path):
    from sklearn.datasets import load_digits
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.metrics import accuracy_score
    from threadpoolctl import threadpool_limits

    X, y = load_digits(return_X_y=True)
    rng = np.random.default_rng(0)
    idx = rng.permutation(len(y))[:1200]
    cols = [f"px{i}" for i in range(X.shape[1])]
    frame = pd.DataFrame(X[idx], columns=cols)
    frame["digit"] = y[idx]
    train, test = frame.iloc[:900], frame.iloc[900:]
    train.to_csv(tmp_path / "train.csv", index=False)
    test[cols].to_csv(tmp_path / "test_features.csv", index=False)
    spec = TaskSpec("classification", ("digit",), "accuracy", ("prediction",))
    with threadpool_limits(1):
        reference = accuracy_score(test["digit"], HistGradientBoostingClassifier(random_state=0)
                                   .fit(train[cols], train["digit"]).predict(test[cols]))
        scores = []
        for i in range(20):
            (tmp_path / "submission.csv").unlink(missing_ok=True)
            _run_in_process(generate_script(spec, np.random.default_rng(300 + i)), tmp_path)
            scores.append(accuracy_score(test["digit"], pd.read_csv(tmp_path / "submission.csv")["prediction"]))
    print(f"\nHGB default {reference:.3f}; scripts: median {np.median(scores):.3f}, max {max(scores):.3f}")
    assert np.median(scores) < reference - 0.03, (reference, sorted(scores))
    assert max(scores) > reference - 0.05, (reference, sorted(scores))  # the good half reaches it: RL has a target


# ----------------------------------------------------------------------------- reply format


def test_extract_code():
    assert extract_code("Here:\n```python\nx = 1\n```\nbye") == "x = 1\n"
    assert extract_code("x = 1\nprint(x)") is None  # unfenced
    assert extract_code("") is None
    assert extract_code("```python\nimport os\nx = (1,\n") == "import os\nx = (1,\n"  # truncated reply
    assert extract_code("```py\na = 2\n```") == "a = 2\n"
    # the first python block wins, over earlier blocks in other languages and later python blocks
    two = "```bash\nls\n```\n```python\nfirst = 1\n```\ntext\n```python\nsecond = 2\n```"
    assert extract_code(two) == "first = 1\n"
    assert extract_code("```python\na = 1\n```\n```python\nb = 2\n```") == "a = 1\n"
    assert extract_code("```\nplain = 3\n```") == "plain = 3\n"  # unlabelled as a fallback
    script = generate_script(TASKS[0][0], np.random.default_rng(0))
    assert extract_code(format_reply(script)).strip() == script.strip()


def test_prompt_and_multi_turn_format():
    desc = TASKS[0][1]
    p = format_prompt(desc)
    assert desc in p and p.endswith(ASSISTANT_MARK + "\n") and format_prompt(p) == p
    reply = format_reply("x = 1")
    nxt = next_observation(p, reply, "status: ok\nscore: 0.5")
    assert nxt.startswith(p + reply + END_MARK) and "score: 0.5" in nxt and nxt.endswith(ASSISTANT_MARK + "\n")
    assert extract_code(nxt[len(p):]) == "x = 1\n"


# ----------------------------------------------------------------------------- the built agent


@pytest.fixture(scope="session")
def policy(agent):
    return CodeAgentPolicy(str(agent[1]), max_new_tokens=160)


def test_agent_build_and_cache_hit(agent):
    cache, path, build_s = agent
    info = agent_info(path)
    print(f"\nagent build: {build_s:.1f}s, {info['n_params']} params, vocab {info['vocab']}, "
          f"{info['steps']} steps / {info['epochs']} epochs, loss {info['train_loss_ema']:.3f}")
    assert path.parent == cache and (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
    assert info["steps"] > 0 and info["n_params"] > 500_000 and info["vocab"] > 1000
    if info["stopped_by"] == "time":  # pragma: no cover - a very busy machine
        warnings.warn(f"the test agent's SFT hit its time cap after {info['steps']} steps")
    t0 = time.perf_counter()
    again = build_default_agent(cache, **BUILD)
    assert again == path and time.perf_counter() - t0 < 1.0
    assert [p.name for p in cache.iterdir()] == [path.name]  # nothing half-built left behind
    base = _cache_key(TEST_CONFIG, TASKS, 3000, 0, 4.0)
    assert base == path.name.removeprefix("agent-")
    assert _cache_key(TEST_CONFIG, TASKS, 3000, 1, 4.0) != base
    assert _cache_key(AgentConfig(hidden_size=192), TASKS, 3000, 0, 4.0) != base
    assert _cache_key(TEST_CONFIG, TASKS[:-1], 3000, 0, 4.0) != base


def test_sft_stops_at_its_step_budget_not_the_clock(tmp_path):
    import dataclasses

    tokenizer, model, _ = make_tiny_lm(tmp_path)
    examples = [(f"<|user|>\ntask {i}\n<|assistant|>\n", f"x = {i}") for i in range(40)]
    cfg = dataclasses.replace(AgentConfig(), batch_tokens=256, max_batch_size=4, epochs=3, threads=1)
    budget = sft(model, tokenizer, examples, dataclasses.replace(cfg, max_steps=7), seed=0, max_seconds=600)
    assert (budget["steps"], budget["stopped_by"]) == (7, "steps")
    epochs = sft(model, tokenizer, examples, cfg, seed=0, max_seconds=600)
    assert epochs["stopped_by"] == "epochs" and epochs["steps"] == 3 * epochs["batches_per_epoch"] > 7


def test_sampled_replies_parse(policy):
    obs = [format_prompt(d) for _, d in TASKS] * 17  # 102 first turns + 18 second turns
    obs += [next_observation(format_prompt(d), format_reply(generate_script(s, np.random.default_rng(i))),
                             "status: ok\nscore: 0.4210") for i, (s, d) in enumerate(TASKS * 3)]
    replies, _ = policy.act(obs, generator=torch.Generator().manual_seed(123))  # temperature 1, plain sampling
    ok = [_parses(extract_code(r)) for r in replies]
    rate = sum(ok) / len(ok)
    print(f"\nparse rate {rate:.3f} on {len(ok)} samples")
    assert rate >= 0.9, [r for r, good in zip(replies, ok) if not good][:3]


UNSEEN = [  # descriptions the agent never trained on (new wording, targets, metrics)
    "Task: loan-default. Will a customer default on a loan, given 12 account features?\n"
    "Target column: default. Metric: accuracy.\nWrite submission.csv with one column `prediction`.",
    # in the suite's own format, as every regression task the agent meets is described
    render_description(title="house-prices", blurb="Estimate the sale price of a house from 8 numeric features.",
                       metric="rmse", budget_s=60, task_type="regression", n_train=1600, n_test=400,
                       feature_columns=["rooms", "area", "age", "distance", "income", "lat", "lon", "floors"],
                       feature_dtypes=["int64", "float64", "int64"] + ["float64"] * 5, target_columns=["price"],
                       target_dtype="float64", classes=None, sample_submission=False),
    "Task: sensor-fault. Classify the fault type (4 classes) of a machine from vibration statistics.\n"
    "Target column: fault. Metric: log_loss.\nWrite submission.csv with columns p_0, p_1, p_2, p_3.",
]


def test_replies_to_unseen_descriptions_mostly_parse(policy):
    # prompt augmentation and the synthetic background tasks keep the agent writing code off its training tasks
    replies, _ = policy.act([format_prompt(d) for d in UNSEEN] * 34, generator=torch.Generator().manual_seed(5))
    rate = float(np.mean([_parses(extract_code(r)) for r in replies]))
    print(f"\nparse rate {rate:.3f} on {len(replies)} samples for unseen descriptions")
    # measured on torch 2.14.1 / transformers 4.57: 0.676 on one clean-clone build, >= 0.7 on two others
    assert rate >= 0.6
    regression = replies[1::3]  # the unseen regression task gets regressors, not classifiers
    assert np.mean([not any(c in r for c in ("Classifier", "SVC(", "LogisticRegression")) for r in regression]) > 0.8


# ----------------------------------------------------------------------------- the policy


def _observations() -> list[str]:
    obs = [format_prompt(d) for _, d in TASKS[:4]]
    # a second-turn observation: a longer prompt in the same batch (left padding is exercised)
    obs.append(next_observation(obs[0], format_reply("x = 1"), "status: error\nNameError: name 'y' is not defined"))
    return obs


def test_act_is_reproducible_and_matches_log_prob(policy):
    obs = _observations()
    before = dict(policy.stats)
    a1, lp1 = policy.act(obs, generator=torch.Generator().manual_seed(7))
    a2, lp2 = policy.act(obs, generator=torch.Generator().manual_seed(7))
    assert a1 == a2 and lp1 == lp2
    a3, _ = policy.act(obs, generator=torch.Generator().manual_seed(8))
    assert a3 != a1
    assert all(np.isfinite(lp1)) and all(v < 0 for v in lp1)
    with torch.no_grad():
        recomputed = policy.log_prob(obs, a1)
    assert recomputed.shape == (len(obs),)
    assert torch.allclose(recomputed, torch.tensor(lp1, dtype=recomputed.dtype), atol=1e-3), (recomputed, lp1)
    # the agreement is the sampler's own arithmetic (KV cache, temperature-1 log-softmax), not the
    # fallback that re-scores non-canonical token sequences with log_prob itself
    sampled = policy.stats["replies"] - before["replies"]
    assert sampled == 3 * len(obs) and policy.stats["recomputed"] - before["recomputed"] <= len(obs) // 2
    # a batch of one gives the same numbers as the padded batch
    with torch.no_grad():
        single = policy.log_prob(obs[-1:], a1[-1:])
    assert abs(float(single[0]) - lp1[-1]) < 1e-3


def test_greedy_is_deterministic(policy):
    obs = _observations()
    g1, lp1 = policy.act(obs, greedy=True)
    g2, lp2 = policy.act(obs, generator=torch.Generator().manual_seed(99), greedy=True)
    assert g1 == g2 and np.allclose(lp1, lp2)
    assert torch.allclose(policy.log_prob(obs, g1).detach(), torch.tensor(lp1, dtype=torch.float32), atol=1e-3)


def test_cap_at_max_new_tokens_and_prompt_truncation(agent):
    short = CodeAgentPolicy(str(agent[1]), max_new_tokens=6, max_prompt_tokens=64)
    obs = _observations()
    # a very long conversation: the head (task description) and the tail (latest feedback) survive
    long_obs = next_observation(obs[0], format_reply("x = 1"), "noise " * 400 + "\nthe latest feedback")
    ids = short.prompt_ids(long_obs)
    assert len(ids) == 64
    text = short.tokenizer.decode(ids, skip_special_tokens=False)
    assert text.startswith(long_obs[:40]) and text.endswith(ASSISTANT_MARK + "\n")
    replies, lps = short.act(obs + [long_obs], generator=torch.Generator().manual_seed(0))
    assert all(len(short.tokenizer(r, add_special_tokens=False)["input_ids"]) <= 6 for r in replies)
    with torch.no_grad():
        assert torch.allclose(short.log_prob(obs + [long_obs], replies), torch.tensor(lps), atol=1e-3)


def test_log_prob_is_differentiable_and_a_step_raises_it(agent):
    pol = CodeAgentPolicy(str(agent[1]), max_new_tokens=160)  # its own copy: this test changes weights
    obs = [format_prompt(TASKS[1][1])]
    reply = format_reply(generate_script(TASKS[1][0], np.random.default_rng(42)))
    lp = pol.log_prob(obs, [reply])
    assert lp.shape == (1,) and lp.requires_grad
    pol.module.zero_grad()
    (-lp.sum()).backward()
    grads = [p.grad for p in pol.module.parameters() if p.grad is not None]
    assert grads and sum(float(g.abs().sum()) for g in grads) > 0
    opt = torch.optim.SGD(pol.module.parameters(), lr=1e-2)
    opt.step()
    with torch.no_grad():
        after = pol.log_prob(obs, [reply])
    assert float(after[0]) > float(lp.detach()[0])
    # a reply the agent would write is far likelier than junk of similar length
    with torch.no_grad():
        junk = pol.log_prob(obs, ["```python\n" + "zq)(" * 40 + "\n```"])
    assert float(junk[0]) < float(after[0])
