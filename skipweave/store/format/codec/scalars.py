"""Scalar kinds: ``none``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``, ``bytearray``.

The tree is JSON without NaN/Infinity literals, so a ``float`` node holds nan and +-inf as a string
(``"s"``), and an ``int`` beyond 64 bits as its decimal string. The encoder builds these nodes inline in its
dispatch (they are the most frequent values); this module holds their shared rules and their decoders.
"""

from __future__ import annotations

import base64
import math
from typing import Any

from skipweave.store.format.tree import float_from_node

INT_JSON_LIMIT = 2**63
"""Ints in ``[-INT_JSON_LIMIT, INT_JSON_LIMIT)`` are JSON numbers in the tree; others are decimal strings."""


def float_node(x: float) -> dict[str, Any]:
    """The ``float`` node of ``x`` (nan and +-inf as strings)."""
    if math.isnan(x):
        return {"t": "float", "s": "nan"}
    if math.isinf(x):
        return {"t": "float", "s": "inf" if x > 0 else "-inf"}
    return {"t": "float", "v": x}


DECODERS = {
    "none": lambda d, n, p: None,
    "bool": lambda d, n, p: bool(n["v"]),
    "int": lambda d, n, p: int(n["s"]) if "s" in n else int(n["v"]),
    "float": lambda d, n, p: float_from_node(n),
    "complex": lambda d, n, p: complex(float_from_node(n["re"]), float_from_node(n["im"])),
    "str": lambda d, n, p: str(n["v"]),
    "bytes": lambda d, n, p: base64.b64decode(n["b64"]),
    "bytearray": lambda d, n, p: bytearray(base64.b64decode(n["b64"])),
}
"""Node tag -> decoder of this module's kinds."""
