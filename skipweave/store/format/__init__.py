"""The on-disk format of a dump dir, in one place: layout, manifests, group files, tensor files, the codec and the
recorded environment, with the versions this code reads and writes (see docs/format.md).

The engine (staging, commit, parts, the background writer) and the upkeep (scan, gc, retention, resume, migrate)
read and write entries through these modules only; nothing else in the package knows a field of a manifest.
"""
