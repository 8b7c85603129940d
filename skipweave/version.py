"""skipweave's release, in a module of its own: the store writes it into what it records (and judges a newer writer by
it), the command prints it, and none of them should import the package's facade (``skipweave/__init__.py``) for it,
which names every public function.

Kept equal to pyproject.toml's ``version``. Imports nothing.
"""

__version__ = "0.2.0"

__all__ = ["__version__"]
