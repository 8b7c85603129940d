"""What a script's source proves of a target before the script runs (:func:`skipweave.weaving.script_source.undefined`).

A refusal stops a user's run, so the table is mostly of scripts that must *not* be refused: every way a name or
method can come from somewhere the source does not show. The end-to-end runs (``skipweave run`` refusing a misspelt
class or method, weaving an inherited or assigned one) are in ``test_main_script.py``.
"""

from __future__ import annotations

import ast
import textwrap

import pytest

from skipweave.weaving.script_source import undefined

POLICY = """
    class Policy:
        def generate(self, prompts):
            return prompts
"""

REFUSED = [  # (source, target, failing part, words of the reason)
    (POLICY, "Polcy.generate", "Polcy", "never defines 'Polcy'; did you mean 'Policy'?"),
    (POLICY, "Policy.generat", "Policy.generat", "class 'Policy' (t.py line 2) has no attribute 'generat'; did you "
                                                 "mean 'generate'?"),
    ("def score(xs):\n    return xs\n", "scor", "scor", "did you mean 'score'?"),
    # a base the script defines is read too, and so is object
    ("class Base:\n    def generate(self):\n        pass\nclass Policy(Base):\n    pass\n", "Policy.generat",
     "Policy.generat", "did you mean 'generate'?"),
    ("class Policy(object):\n    def generate(self):\n        pass\n", "Policy.generat", "Policy.generat", "generate"),
    # a method's local of that name is no attribute of the class; vars(self) in a method binds nothing of the class
    ("class Policy:\n    def run(self):\n        generate = 1\n        return vars(self)\n", "Policy.generate",
     "Policy.generate", "has no attribute 'generate'"),
    (POLICY, "Policy.Generator.x", "Policy.Generator", "has no attribute 'Generator'"),
]

DEFERRED = {  # name -> (source, target): the source cannot prove the target missing
    "defined": (POLICY, "Policy.generate"),
    "imported base": ("from b import Base\nclass Policy(Base):\n    pass\n", "Policy.generat"),
    "expression base": ("class Policy(Generic[T]):\n    pass\n", "Policy.generat"),
    "base with __init_subclass__": (
        "class B:\n    def __init_subclass__(cls):\n        pass\nclass Policy(B):\n    pass\n", "Policy.generat"),
    "decorated": ("@register\nclass Policy:\n    pass\n", "Policy.generat"),
    "metaclass": ("class Policy(metaclass=Meta):\n    pass\n", "Policy.generat"),
    "class body locals()": ("class Policy:\n    locals()['generate'] = f\n", "Policy.generate"),
    "conditional method": ("class Policy:\n    if FAST:\n        def generate(self):\n            pass\n",
                           "Policy.generate"),
    "dunder": ("class Policy:\n    pass\n", "Policy.__call__"),
    "type's member": ("class Policy:\n    pass\n", "Policy.mro"),
    "assigned": ("Policy = make_policy()\n", "Policy.generat"),
    "imported": ("from policies import Policy\n", "Policy.generat"),
    "star import": ("from policies import *\n", "Polcy.generate"),
    "globals()": ("globals()['Policy'] = make()\n", "Polcy.generate"),
    "exec": ("exec(source)\n", "Polcy.generate"),
    "sys.modules": ("import sys\nsetattr(sys.modules[__name__], 'Policy', P)\n", "Polcy.generate"),
    "module __getattr__": ("def __getattr__(name):\n    return 1\nclass Policy:\n    pass\n", "Polcy.x"),
    "defined inside a function only": ("def main():\n    class Policy:\n        pass\n", "Policy.generate"),
    "one of two definitions has it": (
        "if A:\n    class Policy:\n        def generate(self):\n            pass\nelse:\n    class Policy:\n"
        "        pass\n", "Policy.generate"),
    "nested path past the class": ("class Policy:\n    class Inner:\n        pass\n", "Policy.Inner.x"),
}


def _tree(source: str) -> ast.Module:
    return ast.parse(textwrap.dedent(source))


@pytest.mark.parametrize(("source", "target", "failed", "reason"), REFUSED, ids=[t for _, t, _, _ in REFUSED])
def test_a_target_the_source_proves_missing_is_refused(source: str, target: str, failed: str, reason: str) -> None:
    found = undefined(_tree(source), target, "t.py")
    assert found is not None and found[0] == failed and reason in found[1], found


@pytest.mark.parametrize("name", list(DEFERRED))
def test_a_target_the_source_cannot_settle_is_left_to_its_definition(name: str) -> None:
    source, target = DEFERRED[name]
    assert undefined(_tree(source), target, "t.py") is None


def test_a_main_target_with_nothing_close_may_be_another_scripts() -> None:
    """``__main__:`` names every process's script: a name with no close one in this script is not a misspelling
    of it (a launcher script starting the trainer as a child)."""
    tree = _tree(POLICY)
    assert undefined(tree, "Trainer.generate", "t.py", typos_only=True) is None
    assert undefined(tree, "Polcy.generate", "t.py", typos_only=True) is not None
    assert undefined(tree, "Trainer.generate", "t.py") == ("Trainer", "the main script t.py never defines 'Trainer'")
