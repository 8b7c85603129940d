"""A target's declared side effects (``skip.<role>.effects``) and echoes (``skip.<role>.echo``): what a record keeps
of them and how a replay puts them back, see docs/own_trainer.md.

An effect's value after the real call is kept as a plain copy (containers made plain, so the codec needs no
pickle). A list the call only appended to is kept as the items it appended (:class:`Appended`): a trainer that
appends a metrics dict per call would otherwise store the whole, growing list in every step's entry, and the
store would grow with the square of the steps. :class:`DeclaredEffects` takes them around a real call and
restores them on a hit.
"""

from __future__ import annotations

import logging
import operator
import threading
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from skipweave.config.schema import RoleConfig
from skipweave.policy.expressions import Expression, ExpressionFailed

if TYPE_CHECKING:
    from skipweave.weaving.calls import Call

logger = logging.getLogger(__name__)


class Appended(NamedTuple):
    """A declared effect that was a list the real call only appended to: what the record keeps of it."""

    n_before: int
    """Items the list held before the call."""
    tail: list[Any]
    """The items the call appended (plain copies, see :func:`plain_copy`)."""


def appended_items(before: list[Any], items: list[Any], now: Any) -> list[Any] | None:
    """The items a call appended to the list ``before`` that held ``items`` (a shallow copy taken before the call),
    when ``now`` (the effect's value after it) is that very list, and its first ``len(items)`` items are the same
    objects (by identity) as before; ``None`` for anything else (a new list, one shrunk or with an item replaced).
    An item changed in place is the same object: what the call did inside an older item is not seen."""
    if now is not before:
        return None
    current = list.copy(now)
    n = len(items)
    if len(current) < n or not all(map(operator.is_, current, items)):
        return None
    return current[n:]


def recorded_form(was: tuple[list[Any], list[Any]] | None, value: Any) -> Any:
    """What a record keeps of an effect's ``value`` after the call: :class:`Appended` when it is the list ``was``
    names (``(the list, its items before the call)``, see :meth:`DeclaredEffects.lists_before`) and the call only
    appended to it, else a plain copy of the whole value."""
    if was is not None:
        tail = appended_items(*was, value)
        if tail is not None:
            return Appended(len(was[1]), plain_copy(tail))
    return plain_copy(value)


def split_appended(effects: dict[str, Any] | None) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """Split a snapshot's effects (:meth:`DeclaredEffects.after_call`) into the whole values and the appended items
    in the form the store keeps (``{"n_before": int, "tail": list}`` by expression; ``None`` when none)."""
    if not effects or not any(type(v) is Appended for v in effects.values()):
        return effects, None
    whole = {k: v for k, v in effects.items() if type(v) is not Appended}
    appended = {k: {"n_before": v.n_before, "tail": v.tail} for k, v in effects.items() if type(v) is Appended}
    return whole, appended


def plain_copy(value: Any) -> Any:
    """A copy of ``value`` with mapping and list subclasses made plain (a ``defaultdict`` becomes a ``dict``, a
    ``deque`` the list of its items), so the codec stores it without pickle; a replay restores it into the host's
    own containers, types kept (a deque keeps its ``maxlen``), see
    :func:`~skipweave.policy.expressions.restore_in_place`."""
    if isinstance(value, Mapping):
        return {k: plain_copy(v) for k, v in value.items()}
    if isinstance(value, (list, deque)):
        return [plain_copy(v) for v in value]
    if type(value) is tuple:
        return tuple(plain_copy(v) for v in value)
    return value


class DeclaredEffects:
    """The declared effects and echoes of one role's target, taken around its real calls and restored on hits.

    Args:
        role: the role config (``effects``, ``echo``).
        params: the target's parameter names, in order (``self``/``cls`` removed), for the expressions.
        positions: parameter name -> position in the call's ``args``.
        lock: the lock guarding the counts of real calls with effects (the proxy's ledger lock).

    Attributes:
        defaults: parameter name -> default of the target's signature (set by the proxy when the weaver tells
            it): what an expression naming a parameter the call did not pass reads.
    """

    def __init__(self, role: RoleConfig, params: tuple[str, ...], positions: Mapping[str, int] | None,
                 lock: threading.Lock) -> None:
        key = f"skip.{role.role}"
        self.effects = tuple(Expression(f"{key}.effects[{i}]", text, assignable=True, params=params)
                             for i, text in enumerate(role.effects))
        self.echo = tuple((Expression(f"{key}.echo[{dest!r}]", dest, assignable=True, params=params),
                           Expression(f"{key}.echo[{dest!r}]", source, params=params))
                          for dest, source in role.echo)
        self.positions = positions
        self.defaults: Mapping[str, Any] = {}
        self.lock = lock
        self.started = 0  # real calls with effects started so far (see open_call)
        self.open = 0  # ... whose effects are not taken yet
        self.tail_warned: set[str] = set()  # effects a replay appended to a list of another length than run 1's

    # ------------------------------------------------------------------ around a real call
    def open_call(self, d: Call) -> bool:
        """Count a real call with effects as running until its effects are taken (caller holds :attr:`lock`).
        Returns whether it runs alone: no other real call of the target is between its start and its effects.
        Only such a call may record a list's appended items: those of calls running beside it (async tasks,
        threads) would land in its tail too."""
        alone = self.open == 0
        self.open += 1
        self.started += 1
        d.effects_open = self.started
        return alone

    def close_call(self, d: Call) -> bool:
        """End what :meth:`open_call` counted (once per call). Returns whether no other real call started since
        ``d`` did: with its start alone, nothing but ``d`` ran beside it."""
        with self.lock:
            if not d.effects_open:
                return False
            own = self.started == d.effects_open
            self.open -= 1
            d.effects_open = 0
        return own

    def lists_before(self, d: Call) -> dict[str, tuple[list[Any], list[Any]]] | None:
        """The declared effects that are lists right before a recorded real call that runs alone (see
        :meth:`open_call`): expression -> (the list, a shallow copy of its items), what :meth:`after_call`
        compares with to tell a call that only appended. ``None`` when none is a list. One pointer copy per list
        (holding its items keeps their ids theirs); an expression that fails is left to :meth:`after_call`,
        which reports it."""
        # list's own copy: a subclass's overrides not called
        return {text: (value, list.copy(value)) for text, value in self.live_lists(d).items()} or None

    def live_lists(self, d: Call) -> dict[str, list[Any]]:
        """The declared effects that are lists now, by expression (one that fails is left out: the caller that
        records reports it)."""
        out: dict[str, list[Any]] = {}
        for effect in self.effects:
            try:
                value = effect.evaluate(d.instance, (), {}, None)
            except ExpressionFailed:
                continue
            if isinstance(value, list):
                out[effect.text] = value
        return out

    def after_call(self, d: Call) -> dict[str, Any]:
        """The values of the declared side effects now, after the real call (containers as plain copies); a list
        the call only appended to as its new items alone (:func:`recorded_form`)."""
        out: dict[str, Any] = {}
        before = (d.lists_before if self.close_call(d) else None) or {}  # another call ran beside it: whole values
        for effect in self.effects:
            try:
                value = effect.evaluate(d.instance, (), {}, None)
            except ExpressionFailed as exc:
                effect.warn_once(exc, "it is not recorded, and a replay of such a call cannot restore it")
                continue
            out[effect.text] = recorded_form(before.get(effect.text), value)
        return out

    # ------------------------------------------------------------------ on a hit
    def restore(self, d: Call, loaded: Any, result: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        """On a hit: copy the echo values into ``result``, put the recorded side effects back (a list recorded as
        the items the call appended gets them appended).

        Args:
            d: the call served; ``loaded``: its entry (:class:`~skipweave.store.step_store.Loaded`).

        Raises:
            ExpressionFailed: an echo or effect expression failed on this call (nothing of the host changed
                yet when an echo fails: echoes run first), or an effect recorded as appended items is no list
                here (nothing of the host changed yet either).
        """
        for dest, source in self.echo:
            dest.assign(source.evaluate(d.instance, args, kwargs, self.positions, defaults=self.defaults),
                        d.instance, args, kwargs, self.positions, result=result, defaults=self.defaults)
        recorded = loaded.effects or {}
        lists = self._lists_to_extend(d, loaded.appended or {}, args, kwargs)  # checked before anything changes
        for effect in self.effects:
            if effect.text in lists:
                self._append_recorded(effect, lists[effect.text], loaded.appended[effect.text], d.served)
            elif effect.text in recorded:
                effect.assign(recorded[effect.text], d.instance, args, kwargs, self.positions, defaults=self.defaults)
            else:
                effect.warn_once(ExpressionFailed(f"{effect.key} {effect.text!r} is not in the recording of step "
                                                  f"{d.served} (recorded before it was declared, or it failed "
                                                  "then)"), "the replay leaves it as it is")

    def _lists_to_extend(self, d: Call, appended: Mapping[str, Any], args: tuple[Any, ...],
                         kwargs: Mapping[str, Any]) -> dict[str, list[Any]]:
        """The live lists a replay appends recorded items to, by expression: every declared effect the entry
        recorded as appended items (:attr:`~skipweave.store.step_store.Loaded.appended`).

        Raises:
            ExpressionFailed: an effect's expression fails, its live value is no list to append to, or its
                recording is not ``{"n_before": int, "tail": list}`` (a payload no skipweave writes).
        """
        out: dict[str, list[Any]] = {}
        for effect in self.effects:
            if effect.text not in appended:
                continue
            item = appended[effect.text]
            if not (isinstance(item, dict) and type(item.get("n_before")) is int
                    and isinstance(item.get("tail"), list)):
                raise ExpressionFailed(f"{effect.key} {effect.text!r}: the recording of step {d.served} holds "
                                       f"{type(item).__name__} where appended items are expected")
            live = effect.evaluate(d.instance, args, kwargs, self.positions, defaults=self.defaults)
            if not isinstance(live, list):
                raise ExpressionFailed(f"{effect.key} {effect.text!r} is {type(live).__name__} here: the recording "
                                       f"of step {d.served} holds items the real call appended to a list")
            out[effect.text] = live
        return out

    def list_lengths(self, d: Call) -> list[tuple[list[Any], int]]:
        """The declared effects that are lists now with their lengths, for :meth:`drop_appended`."""
        return [(value, len(value)) for value in self.live_lists(d).values()]

    @staticmethod
    def drop_appended(lengths: list[tuple[list[Any], int]]) -> None:
        """Cut the lists of :meth:`list_lengths` (taken before a live call) back to their lengths then, in place:
        what the live call appended goes before a recording is served in its place (a verify run with ``serve:
        recorded``), so the recording's items are appended once, as a replay appends them."""
        for value, n in lengths:
            if len(value) >= n:
                del value[n:]

    def _append_recorded(self, effect: Expression, live: list[Any], item: Mapping[str, Any],
                         served: int | None) -> None:
        """Append an entry's recorded items to the live list, in place (the host's references and the list's type
        kept). A list of another length than the recording's before the call gets them all the same, what the
        call added; one WARNING per effect says so, since the list then differs from run 1's."""
        if len(live) != item["n_before"]:
            with self.lock:
                first = effect.text not in self.tail_warned
                self.tail_warned.add(effect.text)
            (logger.warning if first else logger.debug)(
                "skipweave: %s %r held %d items before the call where the recording's held %d (step %s): the %d "
                "items the real call appended are appended, and the list differs from run 1's (later such "
                "replays at DEBUG)", effect.key, effect.text, len(live), item["n_before"], served, len(item["tail"]))
        live.extend(item["tail"])


__all__ = ["Appended", "DeclaredEffects", "appended_items", "plain_copy", "recorded_form", "split_appended"]
