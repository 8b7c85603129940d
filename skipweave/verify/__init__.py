"""How far two results of one call are apart, and the report that says so.

:mod:`~skipweave.verify.compare` is the comparison itself, over every kind the codec stores (tensors, numpy arrays,
dicts, lists, dataclasses, host objects such as verl's ``DataProto``, scalars), under the role's
:class:`~skipweave.config.compare.CompareSpec`; :mod:`~skipweave.verify.report` is a verify run's JSON-lines report,
its tally and one-line descriptions. Neither reads a store nor runs a call: the verify action
(:mod:`skipweave.weaving.verifier`) and ``skipweave diff`` (:mod:`skipweave.cli.diff`) hand them two decoded results.
"""
