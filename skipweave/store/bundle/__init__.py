"""Portable bundles: one zip file holding complete entries of a dump dir, listable with ordinary tools, replayed
in place (read-only) or unpacked into a dump dir.

- :mod:`~skipweave.store.bundle.layout`: member names, the bundle manifest's name and fields, what a bundle path is;
- :mod:`~skipweave.store.bundle.archive`: :class:`~skipweave.store.bundle.archive.BundleArchive`, the one narrow
  read-only interface every reader of a bundle goes through (open and judge the archive as untrusted input, list its
  members, read one verified);
- :mod:`~skipweave.store.bundle.pack` and :mod:`~skipweave.store.bundle.unpack`: dump dir to bundle and back;
- :mod:`~skipweave.store.bundle.store`: :class:`~skipweave.store.bundle.store.BundleStore`, a role's store over an
  archive (what a run replays from; it records nothing);
- :mod:`~skipweave.store.bundle.scan`: a bundle judged entry by entry as :func:`skipweave.store.scan.scan` judges a
  dump dir (``skipweave ls`` and ``verify``).

See docs/format.md (Bundles) for the layout and what is checked.
"""
