"""Which rules of a :class:`~skipweave.config.compare.CompareSpec` name no field of the results they were meant for.

A ``compare.fields`` rule is a path glob; one with a typo in it (``batch.respones: {atol: 1e-3}``) names nothing,
and the field it meant is compared by the default rule instead, or, under ``default: ignore``, not at all -- a verify
run that then reports every call identical has compared nothing. :func:`unmatched_rules` finds such rules from the
leaf paths :func:`~skipweave.verify.compare.paths` lists (the paths :func:`~skipweave.verify.compare.compare` walks),
so the verify action can say so once per rule (:mod:`skipweave.weaving.verifier`).

``ignore`` rules are left out: one that names nothing changes nothing (the shipped ``rollout_verify`` profile ignores
verl's timings on every host, also where the result has none), and a typo in one shows itself as a divergence at the
field it meant to ignore.
"""

from __future__ import annotations

from typing import Any

from skipweave.config.compare import EXACT, IGNORE, CompareSpec, Rule
from skipweave.verify.compare import paths


def unmatched_rules(spec: CompareSpec, *results: Any) -> list[tuple[str, Rule]]:
    """The ``(pattern, rule)`` pairs of ``spec.fields``, ``ignore`` rules aside, that name no field of any of
    ``results`` (a field or one of its ancestors, as :meth:`CompareSpec.explicit_rule` reads a pattern), in order.

    Args:
        spec: the comparison's rules.
        results: the results compared (the recorded and the live one); each is walked once, whole.
    """
    wanted = [(pattern, rule) for pattern, rule in spec.fields if rule != IGNORE]
    if not wanted:
        return []
    leaves = list(dict.fromkeys(path for result in results for path in paths(result)))
    return [(pattern, rule) for pattern, rule in wanted
            if not any(CompareSpec(fields=((pattern, EXACT),)).explicit_rule(path) is not None for path in leaves)]


def field_sample(*results: Any, limit: int = 8) -> str:
    """Up to ``limit`` leaf paths of ``results`` for a message (``batch.responses, meta_info.timing.gen, …``), or
    ``(none: the result is a single value)``."""
    leaves = [p for p in dict.fromkeys(path for result in results for path in paths(result)) if p]
    if not leaves:
        return "(none: the result is a single value)"
    return ", ".join(leaves[:limit]) + (f", … ({len(leaves)} in all)" if len(leaves) > limit else "")


__all__ = ["field_sample", "unmatched_rules"]
