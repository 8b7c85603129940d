"""Store layer: on-disk layout, codecs, atomic commit, manifests, checksums, locks, completeness."""
