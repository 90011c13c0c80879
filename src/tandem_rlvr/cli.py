"""Command line: ``tandem-rlvr train | eval | demo | config-help | config-show | push``; a few lines per command."""

from __future__ import annotations

import argparse
import os
import sys
import traceback


def _train(args: argparse.Namespace) -> int:
    from tandem_rlvr.config import load_config
    from tandem_rlvr.training.trainer import make_trainer

    cfg = load_config(args.config, args.overrides)
    if not cfg.train.progress:
        from tandem_rlvr.logs import quiet_libraries

        quiet_libraries(downloads=False)
    end = args.run_end  # main() closes the engine and the process group after any stop (RunEnd.close)
    end.trainer = make_trainer(cfg, restart=args.restart)
    final = end.trainer.train()
    end.finished = True
    print(f"done: senior saved to {final}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from tandem_rlvr.evaluation.eval_cli import run_from_args

    return run_from_args(args)


def _demo(args: argparse.Namespace) -> int:
    from tandem_rlvr.demo import run_demo
    from tandem_rlvr.demo.runner import default_out

    setting = dict(quick=args.quick, seeds=args.seeds, junior=args.junior, world=args.world,
                   world_seed=args.world_seed, budget=args.budget, kl_betas=args.kl_betas)
    run_demo(out_dir=args.out or default_out(**setting), force_world=args.rebuild_world, restart=args.restart,
             workers=args.workers, **setting)
    return 0


def _betas(text: str) -> tuple[float, ...]:
    """``--kl-betas``: comma-separated numbers; ``none`` (or nothing) for no KL-Reg runs."""
    if text.strip().lower() in ("", "none"):
        return ()
    try:
        return tuple(float(b) for b in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers or 'none', got {text!r}") from None


def _config_help(args: argparse.Namespace) -> int:
    from tandem_rlvr.config import describe
    from tandem_rlvr.evaluation import options

    print(describe() + "\n\n" + options.describe())
    return 0


def _config_show(args: argparse.Namespace) -> int:
    from tandem_rlvr import configs

    if args.name is None:
        for kind in configs.KINDS:
            print(f"{kind}: {' '.join(configs.names(kind))}")
        return 0
    path = configs.path_of(args.name)
    if path is None:
        raise configs.ConfigError(f"no shipped config {args.name!r} (shipped: {', '.join(configs.names())})")
    print(path if args.path else path.read_text(encoding="utf-8"), end="\n" if args.path else "")
    return 0


def _push(args: argparse.Namespace) -> int:
    from tandem_rlvr.publish import push

    push(args.run_dir, args.repo_id, which=args.folder, eval_dir=args.eval, eval_senior=args.eval_senior,
         private=args.private, revision=args.revision, dry_run=args.dry_run, staging=args.staging,
         trust_unverified=args.trust_unverified)
    return 0


def _add_push(sub) -> None:
    """The ``push`` command's arguments."""
    u = sub.add_parser("push", help="upload a trained senior (final/ or best/) with a model card to the Hugging Face Hub")
    u.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (train.out_dir)")
    u.add_argument("repo_id", metavar="REPO_ID", help="the Hub model repository, owner/name (created if missing)")
    u.add_argument("--folder", choices=("final", "best"), default="final",
                   help="final: the senior after the last step (default); best: the best validation checkpoint")
    u.add_argument("--eval", metavar="DIR", default=None, help="a `tandem-rlvr eval` --out folder: its eval.json goes into the card")
    u.add_argument("--eval-senior", metavar="NAME", default=None,
                   help="the senior's name in eval.json (default: the one evaluated from the pushed folder, or the only one)")
    u.add_argument("--private", action="store_true", help="create the repository private")
    u.add_argument("--revision", metavar="BRANCH", default=None, help="push to this branch (created if missing; default main)")
    u.add_argument("--dry-run", action="store_true", help="write the card and the staging folder, list the files, upload nothing")
    u.add_argument("--staging", metavar="DIR", default=None,
                   help="where the card and the links to the files go (default hub_staging/OWNER__NAME)")
    u.add_argument("--trust-unverified", action="store_true",
                   help="push a folder that has no checksums.json (written by an older version) without verifying it")
    u.set_defaults(func=_push)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    from tandem_rlvr import __version__

    p = argparse.ArgumentParser(prog="tandem-rlvr", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument("--version", action="version", version=f"tandem-rlvr {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a senior (arms trlvr, grpo, kl_reg) from a YAML config")
    t.add_argument("config", help="YAML config file, or a shipped config's name: trlvr, grpo, kl_reg, paper/trlvr, ... "
                                  "(tandem-rlvr config-show lists them)")
    t.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algo.lr=1e-5 train.steps=3")
    t.add_argument("--restart", action="store_true", help="start over instead of resuming: delete the run's own files in train.out_dir (refused if it holds anything else; docs/faults.md)")
    t.set_defaults(func=_train)

    e = sub.add_parser("eval", help="solo / handoff / tax / legibility / drift of senior(s) with a junior")
    from tandem_rlvr.evaluation.eval_cli import add_eval_args

    add_eval_args(e)
    e.set_defaults(func=_eval)

    d = sub.add_parser("demo", help="the paper's experiment in the built-in arithmetic world, on a CPU")
    d.add_argument("--quick", action="store_true", help="1 seed, fewer steps, smaller eval (under a minute on 2 idle cores; direction only)")
    d.add_argument("--junior", choices=("weak", "self"), default="weak",
                   help="weak: the world's weaker junior (default); self: a frozen copy of the senior's warm start")
    from tandem_rlvr.world.registry import DEFAULT_WORLD, WORLDS

    d.add_argument("--world", choices=tuple(WORLDS), default=DEFAULT_WORLD,
                   help="; ".join(f"{w.name}: {w.description}" for w in WORLDS.values()))
    d.add_argument("--seeds", type=int, default=None, help="seeds per run (default 5; 1 with --quick)")
    d.add_argument("--out", default=None, help="output directory (default: demo_out for the default demo, a folder "
                   "of its own for another setting, e.g. demo_out-quick, demo_out-shorthand-self)")
    d.add_argument("--rebuild-world", action="store_true", help="rebuild the cached world models")
    d.add_argument("--restart", action="store_true", help="start over instead of resuming an interrupted demo in --out")
    d.add_argument("--workers", type=int, default=None,
                   help="parallel processes, one job (an arm and seed) each (default: one per CPU)")
    r = d.add_argument_group("robustness checks (docs/demo.md)")
    r.add_argument("--budget", type=int, default=None,
                   help="token budget of the rollouts, the validation and the evaluation (default: the world's plan's)")
    r.add_argument("--world-seed", type=int, default=None,
                   help="build the world under this build seed instead of using the shipped build (a rebuild: minutes)")
    r.add_argument("--kl-betas", type=_betas, default=None,
                   help="the KL-Reg runs' β, comma-separated (default: 0.01,0.1,1); none: only grpo and trlvr")
    d.set_defaults(func=_demo)

    c = sub.add_parser("config-help", help="list every training config key with its documentation")
    c.set_defaults(func=_config_help)

    s = sub.add_parser("config-show", help="print a shipped config (to copy and edit: config-show trlvr > my.yaml); "
                                           "without NAME, list them")
    s.add_argument("name", nargs="?", default=None, help="a shipped config's name, e.g. trlvr, paper/trlvr, accelerate/ddp")
    s.add_argument("--path", action="store_true", help="print the file's path instead of its text")
    s.set_defaults(func=_config_show)

    _add_push(sub)
    return p


def _parse(argv: list[str] | None):
    """The command line; ``train``'s ``key=value`` overrides may also follow its options
    (``train kl_reg --restart train.steps=2``), which argparse alone refuses after an option."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if not extra:
        return args
    if args.command != "train":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    extra = [x for x in extra if x != "--"]  # `train CONFIG --restart -- a=1`
    bad = [x for x in extra if "=" not in x or x.startswith("-")]
    if bad:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices["train"].error(f"unrecognized arguments: {' '.join(bad)}")
    args.overrides = [*args.overrides, *extra]
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point; user errors print one clear line and exit 2 (``TANDEM_DEBUG=1`` shows tracebacks).

    ``train`` ends every stop with its code (docs/faults.md): whatever stopped the run, the engine and then
    the process group are closed; a process of its own (``argv`` None) then exits with the code even where
    threads are still blocked (:class:`tandem_rlvr.training.watchdog.RunEnd`)."""
    try:
        args = _parse(argv)
    except SystemExit as e:  # argparse already printed usage and the error (or --help)
        return e.code if isinstance(e.code, int) else 2
    from tandem_rlvr.logs import quiet_libraries, setup_logging

    setup_logging(args.verbose)  # ours at INFO (-v: DEBUG), other libraries' at WARNING, lines through the bars
    if args.command in ("train", "eval", "demo"):
        quiet_libraries()  # no transformers/datasets bars; the Hub's download bars on a terminal only
    own_process = argv is None and args.command == "train"
    if args.command != "train":
        return _run(args, own_process)
    from tandem_rlvr.training import preempt
    from tandem_rlvr.training.watchdog import RunEnd

    if own_process:  # it exits after a preemption stop
        preempt.EXIT_AFTER_STOP = True
    end = args.run_end = RunEnd()
    code = 1  # an exception that escapes (called in-process) closes the run too
    try:
        code = _run(args, own_process)
    finally:
        end.close(code)
    return end.exit(code) if own_process else code


def _run(args: argparse.Namespace, own_process: bool) -> int:
    """The command's exit code; an unexpected exception is a traceback and code 1 in a process of its own
    (after which the run is still closed), raised otherwise."""
    from tandem_rlvr.errors import Preempted, user_errors

    try:
        return int(args.func(args) or 0)
    except Preempted as e:
        print(f"tandem-rlvr {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    except user_errors() as e:
        if os.environ.get("TANDEM_DEBUG") and not own_process:
            raise
        if os.environ.get("TANDEM_DEBUG"):
            traceback.print_exc()
            return 1
        msg = " ".join(str(e).split()) or type(e).__name__  # one line, whatever the message
        print(f"tandem-rlvr {args.command}: error: {msg}", file=sys.stderr)
        return getattr(e, "exit_code", 2)
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to resume from the last checkpoint", file=sys.stderr)
        return 130
    except Exception:
        if not own_process:
            raise
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
