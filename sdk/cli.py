"""The `wmrl` command: train, eval, bench, report.

    wmrl train [CONFIG] [key=value ...]   train (or resume) a run; CONFIG is a YAML path or a shipped name
    wmrl eval RUN_DIR [key=value ...] [--split S ...] [--step N] [--reuse]
                                          real held-out reward of a run's checkpoint, per split and per task
    wmrl export RUN_DIR OUT               the trained policy as a standard model folder (from_pretrained loads it)
    wmrl eval-wm RUN_DIR [--world-model NAME] [--warmup N]
                                          a world model's fidelity on the run's real executions
    wmrl bench NAME [key=value ...]       run a benchmark from bench/ (JSON out); NAME --help lists its options
    wmrl report RUN_DIR                   write RUN_DIR/report.md with plots
    wmrl vla STAGE [CONFIG] [key=value ...]
                                          the VLA pipeline: collect | bc | eval | demo (all three + report)

Configuration mistakes exit with status 2 and one line that says what to fix,
never a traceback; so do a full disk, damaged checkpoints and a run directory
another process holds (status 1). SIGINT / SIGTERM stop `train` after the step
in progress, at a checkpoint (status 130 / 143); the same command resumes.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import sys
from pathlib import Path


def _env_defaults() -> None:
    # one thread per process keeps CPU timings stable; no hidden network access
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv: list[str] | None = None) -> int:
    _env_defaults()
    parser = argparse.ArgumentParser(prog="wmrl", description="World Model RL post-training")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("train", help="train or resume a run")
    p.add_argument("config", nargs="?", default="synthetic-program", help="YAML path or shipped config name")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-report", action="store_true")
    p = sub.add_parser("eval", help="evaluate a run's checkpoint on held-out tasks (fresh episodes)")
    p.add_argument("run_dir")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides, as for train (e.g. domain.task_root=DIR)")
    p.add_argument("--split", action="append", dest="splits")
    p.add_argument("--step", type=int, default=None, help="the checkpoint of this step (default: the latest)")
    p.add_argument("--reuse", action="store_true", help="read back the run's own evaluation at that step")
    p = sub.add_parser("export", help="write a run's trained policy as a standard model folder")
    p.add_argument("run_dir")
    p.add_argument("out")
    p = sub.add_parser("eval-wm", help="measure a world model against a run's real executions")
    p.add_argument("run_dir")
    p.add_argument("--world-model", default=None, help="a world model the run's domain offers (default: the run's)")
    p.add_argument("--warmup", type=int, default=32, help="real executions to fit on before predictions count")
    p = sub.add_parser("bench", help="run a benchmark (JSON out); `wmrl bench NAME --help` lists its options",
                       add_help=False)
    p.add_argument("name", help="benchmark name, e.g. speedup")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="option=value, or --help")
    p = sub.add_parser("report", help="write a run's Markdown report")
    p.add_argument("run_dir")
    p = sub.add_parser("vla", help="VLA pipeline: scripted demos -> LeRobotDataset -> BC -> evaluation")
    p.add_argument("stage", choices=["collect", "bc", "eval", "demo"])
    p.add_argument("overrides", nargs="*", help="a YAML path first (optional), then key.sub=value overrides")
    p.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.cmd == "train" and "=" in args.config and not os.path.exists(args.config):
        # `wmrl train key=value ...`: argparse hands the first override to CONFIG; it is an override
        args.overrides.insert(0, args.config)
        args.config = "synthetic-program"
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    from wmrl.config import ConfigError, resolve_config_path
    from wmrl.core.errors import CheckpointError, Interrupted, RunLocked, StorageError

    try:
        if args.cmd == "train":
            from wmrl.api import train
            from wmrl.config import load_config
            from wmrl.launch import is_leader, launch_ranks, under_launcher
            from wmrl.report import write_report

            ranks = load_config(args.config, args.overrides).engine.world_size
            if ranks > 1 and not under_launcher():
                return launch_ranks(ranks, sys.argv[1:] if argv is None else argv)
            res = train(args.config, args.overrides, progress=not args.no_progress)
            if not is_leader():
                return 0  # the leader prints the run's result
            if res.finished_before:
                print(f"{res.run_dir} finished its {res.config.trainer.steps} steps before; its stored result "
                      "(nothing ran: `wmrl eval RUN_DIR` evaluates it afresh, a larger trainer.steps trains on):")
            print(json.dumps({"run_dir": str(res.run_dir), "final": res.final}))
            if not args.no_report:
                print(f"report: {write_report(res.run_dir)}")
        elif args.cmd == "eval":
            from wmrl.api import evaluate

            res = evaluate(args.run_dir, args.splits, args.overrides, step=args.step, reuse=args.reuse)
            print(json.dumps({split: r["reward"] for split, r in res["splits"].items()}))
            print(Path(res["report"]).read_text())
            print(f"results: {res['report']}")
        elif args.cmd == "export":
            from wmrl.api import export

            try:  # a policy that cannot export says so in a NotImplementedError
                print(f"exported: {export(args.run_dir, args.out)}")
            except NotImplementedError as exc:
                raise ConfigError(str(exc)) from None
        elif args.cmd == "eval-wm":
            from wmrl.wm_eval import evaluate_world_model

            res = evaluate_world_model(args.run_dir, args.world_model, warmup=args.warmup)
            for section, m in res.items():
                if isinstance(m, dict):
                    print(f"{section}: n={m['n']} within-group spearman={m['within_group_spearman']} "
                          f"mae={m['mae']} 80% coverage={m['coverage'].get('0.8')}")
            print(f"results: {Path(args.run_dir) / 'wm_eval' / (res['world_model'] + '.json')}")
        elif args.cmd == "bench":
            from wmrl.bench import help_text, run_benchmark

            if {"-h", "--help"} & set(args.overrides):
                print(help_text(args.name), end="")
            else:
                print(f"results: {run_benchmark(args.name, args.overrides)}")
        elif args.cmd == "report":
            from wmrl.report import write_report

            print(f"report: {write_report(args.run_dir)}")
        elif args.cmd == "vla":
            from wmrl.registry import vla_pipeline

            pipeline = vla_pipeline()
            path = args.overrides.pop(0) if args.overrides and "=" not in args.overrides[0] else None
            try:  # the pipeline's bad inputs (config, dataset features) are ValueErrors that say what to fix
                cfg = pipeline.load_pipeline_config(resolve_config_path(path or "vla"), args.overrides)
                out = pipeline.STAGES[args.stage](cfg, not args.no_progress)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            print(json.dumps({k: v for k, v in out.items() if k != "config"}, default=str))
    except (ConfigError, FileNotFoundError, KeyError) as exc:
        # a KeyError's str() is its repr; an OSError's args[0] is its errno
        print(f"wmrl {args.cmd}: error: {exc.args[0] if isinstance(exc, KeyError) and exc.args else exc}",
              file=sys.stderr)
        return 2
    except Interrupted as exc:
        print(f"wmrl {args.cmd}: {exc}", file=sys.stderr)
        return 128 + exc.signum
    except (StorageError, CheckpointError, RunLocked) as exc:
        print(f"wmrl {args.cmd}: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(f"wmrl {args.cmd}: error: {StorageError.of(exc, exc.filename or os.getcwd(), 'could not write')}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
