"""Every environment variable skipweave reads or sets, named once.

Processes of one run talk through the environment: ``skipweave run`` hands its children the plan, a woven driver
hands its Ray workers the plan and the application's own setup hook, and every process of a run inherits the run's
id. Each module that reads one of these names imports it from here, so a variable is spelled in one place.

This module imports nothing, so every layer may import it.
"""

from __future__ import annotations

PLAN_ENV = "SKIPWEAVE_PLAN"
"""The woven plan as JSON (``SkipConfig.to_config()``, ``{"skip": {...}}``): set by ``skipweave run`` for every
process of the launched program, and by a woven driver's ``ray.init`` for every Ray worker of its job."""

APP_HOOK_ENV = "SKIPWEAVE_APP_SETUP_HOOK"
"""The dotted path of the application's own Ray ``worker_process_setup_hook``, run after skipweave's."""

APP_HOOK_PICKLE_ENV = "SKIPWEAVE_APP_SETUP_HOOK_PICKLE"
"""The application's own Ray setup hook when no path reaches it (a lambda, a closure), as base64 cloudpickle."""

LOG_LEVEL_ENV = "SKIPWEAVE_LOG_LEVEL"
"""Set by ``skipweave run -v/--log-level``: each process shows skipweave's log lines on stderr at this level."""

PROGRAM_PID_ENV = "SKIPWEAVE_PROGRAM_PID"
"""Set by ``skipweave run`` to its own pid, which the command it execs keeps: the program's first process, the one
that accounts at exit for targets no process of the program wove."""

RUN_ENV = "SKIPWEAVE_RUN"
"""The id of the run: every process of one run (children, Ray workers) inherits it and is a writer of that run."""

RUN_STARTED_ENV = "SKIPWEAVE_RUN_STARTED"
"""When the run began (seconds since the epoch), set with :data:`RUN_ENV`."""

SHARED_MARKS_ENV = "SKIPWEAVE_SHARED_MARKS"
"""Set by a woven driver's ``ray.init`` for its workers: ``{dump_dir: token}`` as JSON, the marks it left in each dump
dir of its plan, which each worker looks for in its own (:mod:`skipweave.weaving.shared_dirs`)."""

SUMMARY_ENV = "SKIPWEAVE_SUMMARY"
"""``0`` keeps the exit summary off stderr in a program that configured no logging."""

STRICT_REPORT_ENV = "SKIPWEAVE_STRICT_REPORT"
"""Set by ``skipweave run`` in a strict run: the file to which every woven process of the program appends, at exit,
what skipweave failed at in it (:mod:`skipweave.failures`), which the launcher reads once the program ended."""

PROFILE_PATH_ENV = "SKIPWEAVE_PROFILE_PATH"
"""Folders (``os.pathsep``-separated) searched for ``<name>.yaml`` profiles before the shipped ones."""

PROGRESS_ENV = "SKIPWEAVE_PROGRESS"
"""``0`` turns progress bars off, ``1`` on even when stderr is no terminal; unset: on for a terminal."""

MAP_ENV = "SKIPWEAVE_MAP_PAYLOADS"
"""``0`` reads every tensor payload into memory: no replayed tensor is backed by a mapping of its file (for a dump dir
that another program rewrites in place, docs/format.md "Reading without a copy"); unset or anything else: large plain
payloads on a local disk are mapped."""

DISABLED_INTEGRATIONS_ENV = "SKIPWEAVE_DISABLED_INTEGRATIONS"
"""Comma-separated names of integrations (``verl,ray``) a process does not load, whatever their host's version
(docs/integrations.md)."""

FORCE_INTEGRATIONS_ENV = "SKIPWEAVE_FORCE_INTEGRATIONS"
"""Comma-separated names of integrations loaded although their host package's installed version is outside the range
they declare (one WARNING each still says so); :data:`DISABLED_INTEGRATIONS_ENV` wins over it."""

WARNED_INTEGRATIONS_ENV = "SKIPWEAVE_WARNED_INTEGRATIONS"
"""Set by a process that warned about an integration (``verl=0.12.0``: its host version; ``mine=broken``: its
declaration or a part failed to load; ``SKIPWEAVE_DISABLED_INTEGRATIONS=vrel``: a switch naming no integration), comma
separated: the processes it starts inherit it and say the same at DEBUG only, so that one run gives one WARNING each."""

__all__ = ["APP_HOOK_ENV", "APP_HOOK_PICKLE_ENV", "DISABLED_INTEGRATIONS_ENV", "FORCE_INTEGRATIONS_ENV",
           "LOG_LEVEL_ENV", "MAP_ENV", "PLAN_ENV", "PROFILE_PATH_ENV", "PROGRAM_PID_ENV", "PROGRESS_ENV", "RUN_ENV",
           "RUN_STARTED_ENV", "SHARED_MARKS_ENV", "STRICT_REPORT_ENV", "SUMMARY_ENV", "WARNED_INTEGRATIONS_ENV"]
