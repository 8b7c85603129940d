"""Run the samples of one doc page in document order (driven by ``test_doc_samples.py``).

Usage: ``python sample_runner.py BLOCKS.json`` from the folder the samples should run in. ``BLOCKS.json``
holds ``{"doc": <absolute path of the page>, "blocks": [{"lang", "line", "code"}, ...]}``.

- ``python`` blocks run in this process, one after the other in one namespace (like notebook cells),
  with this folder first on ``sys.path``, as for ``python script.py`` run from here. Each block is
  compiled under the page's path with its own line numbers, so a traceback points at the page.
- ``bash`` blocks run with ``bash -e -o pipefail`` in this folder and must exit 0.
- a block with ``write_to`` (a yaml block after ``<!-- write: PATH -->``) is written to that path.

Exit status 0 when every block succeeded, 1 at the first failure (after printing which block failed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback


def main(spec_path: str) -> int:
    with open(spec_path, encoding="utf-8") as fh:
        spec = json.load(fh)
    doc = spec["doc"]
    sys.path[0] = os.getcwd()  # not this runner's folder: the samples' own folder, as for `python script.py`
    namespace: dict[str, object] = {"__name__": "__main__"}
    for block in spec["blocks"]:
        where = f"{doc}:{block['line']}"
        print(f"----- {block['lang']} block at {where}" + (f" -> {block['write_to']}" if block.get("write_to") else ""),
              flush=True)
        if block.get("write_to"):
            os.makedirs(os.path.dirname(block["write_to"]) or ".", exist_ok=True)
            with open(block["write_to"], "w", encoding="utf-8") as fh:
                fh.write(block["code"])
        elif block["lang"] == "python":
            # Pad so that line numbers in tracebacks are the page's: the code starts on the fence's next line.
            code = compile("\n" * block["line"] + block["code"], doc, "exec")
            try:
                exec(code, namespace)
            except BaseException:  # noqa: BLE001 - report every failure, SystemExit included
                traceback.print_exc()
                print(f"FAILED: python block at {where}", flush=True)
                return 1
            sys.stdout.flush()
            sys.stderr.flush()
        else:
            proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block["code"]], check=False)
            if proc.returncode != 0:
                print(f"FAILED: bash block at {where} exited with status {proc.returncode}", flush=True)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
