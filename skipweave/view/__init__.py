"""One self-contained HTML page of a store (``skipweave view``): a steps table, charts, a sample browser, a diff.

A generic layer, beside :mod:`skipweave.export`: it reads stores through :mod:`skipweave.store.scan`, splits each
result into samples with :mod:`skipweave.export.samples` (host types' ``samples``), and names no host. Its modules:
:mod:`~skipweave.view.fields` (which fields hold rewards and lengths: the one place of that knowledge),
:mod:`~skipweave.view.summary` (the walk over a store: per-step figures and the first samples of each step),
:mod:`~skipweave.view.diffs` (a diff's rows per step and the first diverging sample side by side),
:mod:`~skipweave.view.charts` (matplotlib charts as inline SVG) and :mod:`~skipweave.view.page` (the HTML, every
string from the store escaped, written atomically). See docs/view.md.
"""
