"""Verifying a live result against a recording: what "equal" means per field, and where two results first differ.

:mod:`~skipweave.verify.compare` is the comparison itself, over every kind the codec stores (tensors, numpy arrays,
dicts, lists, dataclasses, host objects such as verl's ``DataProto``, scalars). It imports nothing of the store or
the weaving layer: the verify action (issue 30) and ``skipweave diff`` call it with two decoded results.
"""
