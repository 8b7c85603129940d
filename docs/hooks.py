"""MkDocs hooks (``hooks:`` in mkdocs.yml): stand-ins for pages that may be missing from a checkout.

``docs/performance.md`` holds the benchmark's numbers and is in the repository; should it be missing (a
partial checkout, a docs build from an older tree), the build gets the short stand-in below so that
``mkdocs build --strict`` passes and the links to it resolve. While the real file exists this hook adds
nothing. Excluded from the site by ``exclude_docs`` in mkdocs.yml.
"""

from __future__ import annotations

from typing import Any

from mkdocs.structure.files import File, Files

STAND_INS = {
    "performance.md": """# Performance

The measured numbers of this page are not written yet. They come from the benchmark in the repository:

```console
python bench/run.py            # this machine's numbers (7-30 minutes)
python bench/run.py --quick    # a smoke run (under a minute)
```

It measures the cost per call of the bypass and decision paths beside a bare call and wrapt's own
pass-through, record and replay of a verl-sized rollout batch beside raw I/O, `torch.save` and pickle,
start-up (`import skipweave`, weaving, a Hydra app with and without a profile), and the main job of the
[Quick start](quickstart.md).
""",
}
"""Page path -> Markdown used when the docs folder has no such page."""


def on_files(files: Files, config: Any) -> Files:
    """Add a stand-in for every page of :data:`STAND_INS` missing from the docs folder."""
    for path, content in STAND_INS.items():
        if files.get_file_from_path(path) is None:
            files.append(File.generated(config, path, content=content))
    return files
