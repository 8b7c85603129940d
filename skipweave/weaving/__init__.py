"""Weave layer: target paths to wrapt patches; sync/async skip proxies; idempotent weave, exact unweave."""
