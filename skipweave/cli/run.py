"""``skipweave run --skip PROFILE [--skip PROFILE ...] [OVERRIDES...] -- COMMAND...``: run a program
woven with one or more profiles.

Example::

    skipweave run --skip rollout_cache skip.rollout.dump_dir=/data/rollouts \\
        +skip.rollout.targets.gen=my_pkg.rollout.Manager.generate -- python train.py --epochs 3
    skipweave run --skip rollout_cache --skip ./my_trainer.yaml -- python train.py

A profile is a shipped name, a name on ``SKIPWEAVE_PROFILE_PATH`` or a path to a YAML file; several
(``--skip`` repeated, or ``--skip a,b``) compose in order, later ones winning. The overrides use Hydra's
command-line syntax, exactly as after ``+skip=rollout_cache`` in a Hydra app, and win over every profile.

``--strict`` (or ``skip.strict: true`` in the plan) makes a run in which skipweave failed at what it was asked end
with :data:`EXIT_STRICT` when the program itself ended with 0 (:mod:`skipweave.integrations.launcher.waiting`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from skipweave.failures import STRICT_EXIT

EXIT_CONFIG = 2
EXIT_NOT_FOUND = 127
EXIT_STRICT = STRICT_EXIT
"""A strict run in which skipweave failed while the program ended with 0 (:data:`skipweave.failures.STRICT_EXIT`)."""

DESCRIPTION = """\
Run COMMAND with a skipweave profile woven into every Python process it starts, with no change to
the program. PROFILE is a shipped profile (rollout_cache, rollout_repeat, rollout_replay, rollout_verify,
async_rollout_cache, ref_cache, reward_cache, values_cache, old_log_prob_cache, update_only, trl_grpo_cache,
trl_grpo_replay, trl_grpo_verify, trl_rloo_cache, trl_rloo_replay, trl_rloo_verify, off),
a <name>.yaml in a folder of SKIPWEAVE_PROFILE_PATH, or a path to a YAML file (ending in .yaml/.yml
or holding a '/'). Several profiles (--skip repeated, or --skip a,b) compose in order, later ones
winning. The overrides use Hydra's command-line syntax, as after +skip=PROFILE in a Hydra app, and
win over every profile.

exit status: 2 when the plan is invalid or a target does not resolve (nothing started), 127 when COMMAND
is not found, else the program's own; with --strict, 4 when the program ended with 0 but skipweave failed
at what it was asked (a target never woven, a role that recorded and replayed nothing, a record that
failed, a step or bypass that could not be read), each named on stderr with its key.

examples:
  skipweave run --skip rollout_cache skip.rollout.dump_dir=/data/rollouts \\
      +skip.rollout.targets.gen=my_pkg.rollout.Manager.generate -- python train.py --epochs 3
  skipweave run --skip rollout_cache --skip ./my_trainer.yaml -- python train.py
  skipweave run --skip trl_grpo_cache skip.rollout.dump_dir=/data/grpo -- accelerate launch train_grpo.py
"""


def register(subparsers: Any) -> None:
    """Add the ``run`` subcommand to ``subparsers``."""
    parser = subparsers.add_parser(
        "run",
        help="run a program with a skip profile woven in (no change to the program)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="skipweave run --skip PROFILE [--skip PROFILE ...] [OVERRIDE ...] -- COMMAND [ARG ...]",
    )
    parser.add_argument(
        "--skip",
        required=True,
        action="append",
        metavar="PROFILE",
        help="profile to weave: a shipped name, a name on SKIPWEAVE_PROFILE_PATH or a YAML file; "
        "repeat it (or separate with commas) to compose several, later ones winning",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="OVERRIDE",
        help="Hydra-style overrides, e.g. skip.rollout.dump_dir=/x +skip.rollout.targets.gen=m.C.f",
    )
    parser.add_argument(
        "--no-preflight",
        action="store_true",
        help="do not check, before launching `python script.py`, that the targets' modules exist and that the "
        "script can define its own targets",
    )
    parser.add_argument(
        "--log-level",
        default=None, metavar="LEVEL", type=lambda v: v.upper(), choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="show skipweave's log lines on stderr in every process of the program at LEVEL (DEBUG, INFO, "
        "WARNING, ERROR), whatever logging the program sets up",
    )
    parser.add_argument(
        "-v", "--verbose", dest="log_level", action="store_const", const="INFO",
        help="the same as --log-level INFO: a hit or miss line per call, the start-up line and the summary",
    )
    parser.add_argument(
        "--print-plan",
        action="store_true",
        help="print the composed plan as JSON and exit without running anything; with '-- COMMAND', also check "
        "its targets as a run would before starting it (exit 2 when one cannot resolve)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help=f"end with exit status {EXIT_STRICT} when the program ends with 0 but skipweave failed at what it was "
        "asked: a target never woven, a role that recorded and replayed nothing, a record that failed, a step or "
        "bypass that could not be read (sets skip.strict=true; the program then runs as a child of skipweave run, "
        "which passes on SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Compose and validate the plan, then replace this process with the command (returns only on error); a strict
    plan runs the command as a child instead, and returns the status to end with."""
    import dataclasses

    from skipweave.config.errors import ConfigError
    from skipweave.integrations.launcher import child_env, compose_plan, exec_command, preflight
    from skipweave.integrations.launcher.bootstrap import LOG_LEVEL_ENV
    from skipweave.integrations.startup import BEFORE_PROGRAM, failure_message

    try:
        plan = compose_plan(args.skip, args.overrides)
    except ConfigError as exc:
        print(f"skipweave run: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.strict:
        plan = dataclasses.replace(plan, strict=True)
    where = "skipweave run " + " ".join(f"--skip {spec}" for spec in args.skip)
    if args.print_plan:
        print(json.dumps(plan.to_config(), indent=2))
        # With a command, the check a run makes before starting it: a target that cannot resolve fails here too.
        problems = preflight(plan, args.command) if args.command and not args.no_preflight else []
        for problem in problems:
            print(failure_message(problem, plan, where=f"{where} --print-plan", when=BEFORE_PROGRAM),
                  file=sys.stderr)
        return EXIT_CONFIG if problems else 0
    if not args.command:
        print(
            "skipweave run: nothing to run; put the command after '--', e.g. "
            "skipweave run --skip rollout_cache -- python train.py",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    problems = [] if args.no_preflight else preflight(plan, args.command)
    for problem in problems:
        print(failure_message(problem, plan, where=where, when=BEFORE_PROGRAM), file=sys.stderr)
    if problems:
        return EXIT_CONFIG
    try:
        env = child_env(plan)
        if args.log_level:
            env[LOG_LEVEL_ENV] = args.log_level
        if plan.strict:
            from skipweave.integrations.launcher.waiting import run_judged

            return run_judged(args.command, env)
        exec_command(args.command, env)
    except (FileNotFoundError, PermissionError) as exc:
        print(f"skipweave run: cannot run {args.command[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_NOT_FOUND
