"""The host application's own Ray ``worker_process_setup_hook`` (skipweave must chain it, not replace it)."""

import os


def app_hook() -> None:
    """Leave a trace the actors report back."""
    os.environ["APP_HOOK_RAN"] = "dotted"
