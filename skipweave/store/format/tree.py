"""Reading a codec tree without its tensors (and without torch): version check, paths, leaf summary.

The CLI's ``show`` lists an entry's leaves from the tree file alone; keeping this apart from
:mod:`skipweave.store.format.codec`, which needs torch to build tensors, lets it start in a fraction of a second
instead of paying torch's import (~2-3 s). The codec re-exports what it takes from here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeAlias

import numpy as np

from skipweave.store.hosts import host_for_kind

READABLE_VERSIONS = (1, 2)
"""Codec versions this skipweave reads (see :mod:`skipweave.store.format.codec`, *Versions*)."""


class CodecError(Exception):
    """A value cannot be encoded or a tree cannot be decoded; the message names the path and the type."""


def key_label(key: Any) -> str:
    """The path part naming a dict key in error messages and summaries, e.g. ``['input_ids']``."""
    return f"[{key!r}]"


def child_path(path: str, suffix: str) -> str:
    """Join a path and a suffix; ``suffix`` is ``"[...]"`` or ``".name"``."""
    if not path and suffix.startswith("."):
        return suffix[1:]
    return path + suffix


NodePath: TypeAlias = str | tuple[Any, Callable[[Any], str], Any]
"""Where a node sits, for error messages, built as text only when one is raised.

Encoding and decoding pass each child the path naming it (``obj['rng']['python'].state``). Formatting it as
text for every node (a ``repr`` of the key, a concatenation) was a large part of a small entry's cost, and it
is read only in errors. So a path is the root name (a ``str``) or a tuple ``(parent, label, value)``: the
parent's path and the function making this level's suffix from ``value`` (``key_label``, ``index_label``,
``attr_label``, ``str`` for a fixed suffix such as ``".data"``); :func:`path_text` formats it.
"""


def index_label(i: Any) -> str:
    """The path part naming a sequence index, e.g. ``[3]``."""
    return f"[{i}]"


def attr_label(name: Any) -> str:
    """The path part naming an attribute or field, e.g. ``.meta_info``."""
    return f".{name}"


def path_text(path: NodePath) -> str:
    """The text of a :data:`NodePath`, e.g. ``result.batch['input_ids']``.

    Formatted iteratively, so a path as deep as the recursion limit allows is formatted without recursing.
    """
    suffixes: list[str] = []
    while type(path) is tuple:
        path, label, value = path
        suffixes.append(label(value))
    text = path if isinstance(path, str) else str(path)  # the root name, a str
    for suffix in reversed(suffixes):
        text = child_path(text, suffix)
    return text


def float_from_node(node: Mapping[str, Any]) -> float:
    """The float of a ``float`` node (``"s"`` holds nan/inf/-inf, which JSON cannot)."""
    if "s" in node:
        return float(node["s"])
    return float(node["v"])


def check_root(tree: Mapping[str, Any]) -> Any:
    """Return the root node of a tree after checking its ``codec_version``.

    Raises:
        CodecError: not a tree, or a ``codec_version`` this skipweave does not read (the message names both).
    """
    if not isinstance(tree, Mapping) or "codec_version" not in tree or "root" not in tree:
        raise CodecError("not a codec tree: expected a dict with 'codec_version' and 'root'")
    version = tree["codec_version"]
    if type(version) is not int or version not in READABLE_VERSIONS:
        known = " and ".join(str(v) for v in READABLE_VERSIONS)
        raise CodecError(
            f"unknown codec_version {version!r} (this skipweave understands {known}); "
            "the recording was written by a different skipweave version"
        )
    return tree["root"]


def _leaf_row(node: Mapping[str, Any], path: str) -> dict[str, Any]:
    tag = node["t"]
    if tag == "tensor":
        return {"path": path, "kind": "tensor", "dtype": node["dtype"], "shape": list(node["shape"])}
    if tag == "ndarray":
        return {
            "path": path,
            "kind": "ndarray",
            "dtype": str(np.dtype(node["dtype"])),
            "shape": list(node["shape"]),
        }
    if tag == "npscalar":
        return {"path": path, "kind": "npscalar", "dtype": str(np.dtype(node["dtype"])), "shape": []}
    if tag in ("enum", "pickle"):
        return {"path": path, "kind": tag, "dtype": node.get("cls") or node.get("type"), "shape": []}
    if tag == "torch_size":
        return {"path": path, "kind": tag, "dtype": "torch.Size", "shape": [len(node["v"])]}
    if tag == "none":
        return {"path": path, "kind": "none", "dtype": "NoneType", "shape": []}
    return {"path": path, "kind": tag, "dtype": tag, "shape": []}


def _walk(node: Mapping[str, Any], path: str) -> Iterator[dict[str, Any]]:
    tag = node.get("t")
    if tag == "dict":
        if "v" in node:
            for k, v in node["v"].items():
                yield from _walk(v, child_path(path, key_label(k)))
        else:
            for kn, vn in node["kv"]:
                yield from _walk(vn, child_path(path, key_label(_summary_key(kn))))
    elif tag in ("list", "tuple", "set", "frozenset"):
        for i, v in enumerate(node["v"]):
            yield from _walk(v, child_path(path, f"[{i}]"))
    elif tag in ("namedtuple", "dataclass"):
        for k, v in node["v"].items():
            yield from _walk(v, child_path(path, f".{k}"))
    else:
        host = host_for_kind(tag) if type(tag) is str else None
        if host is None:
            yield _leaf_row(node, path)
            return
        for suffix, child in host.children(node):
            yield from _walk(child, child_path(path, suffix))


def _summary_key(node: Mapping[str, Any]) -> Any:
    """Best-effort Python value of a dict key node, for display only (no tensors needed)."""
    tag = node.get("t")
    if tag in ("str", "bool"):
        return node["v"]
    if tag == "int":
        return int(node["s"]) if "s" in node else node["v"]
    if tag == "float":
        return float_from_node(node)
    if tag == "none":
        return None
    if tag == "tuple":
        return tuple(_summary_key(n) for n in node["v"])
    if tag == "enum":
        return f"{node['cls']}.{node.get('name', '?')}"
    return f"<{tag}>"


def summarize(tree: Mapping[str, Any], *, root: str = "") -> list[dict[str, Any]]:
    """List the leaves of an encoded tree without needing its tensors.

    Containers (dict, list, tuple, set, namedtuple, dataclass, host types such as a DataProto) are expanded;
    object-dtype numpy arrays are reported as one leaf. Empty containers produce no row.

    Args:
        tree: ``Encoded.tree`` (the ``{"codec_version": ..., "root": ...}`` wrapper) or a bare node.
        root: prefix for the paths (default empty, so a DataProto root gives ``"batch['input_ids']"``).

    Returns:
        One dict per leaf: ``{"path": str, "kind": str, "dtype": str, "shape": list[int]}``. ``kind`` is the
        node type tag (``"tensor"``, ``"ndarray"``, ``"int"``, ``"str"``, ``"pickle"``, ...); ``dtype`` is
        e.g. ``"torch.bfloat16"`` / ``"int64"`` for arrays, the numpy dtype for numpy scalars, the class
        reference for enums and pickled values, otherwise the tag; ``shape`` is ``[]`` for scalars.

    Raises:
        CodecError: unknown ``codec_version`` or malformed tree.
    """
    node = check_root(tree) if "codec_version" in tree else tree
    try:
        return list(_walk(node, root))
    except (KeyError, TypeError, AttributeError) as exc:
        raise CodecError(f"malformed codec tree: {type(exc).__name__}: {exc}") from exc
