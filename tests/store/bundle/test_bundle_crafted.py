"""A bundle is untrusted input: each crafted or damaged one is refused with a message naming the member, nothing is
written (inside or outside the target folder) and nothing is served.

Each case plants one flaw in a bundle otherwise consistent (its manifest lists its members, the comment vouches for
the manifest), so the check that refuses it is the one under test.
"""

from __future__ import annotations

import os
import stat
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import skipweave
from skipweave.cli.main import main
from skipweave.store.bundle.archive import BundleArchive, BundleRefused
from skipweave.store.bundle.pack import pack
from skipweave.store.bundle.unpack import unpack
from skipweave.store.format.manifest import bytes_checksum
from tests.store.bundle.bundling import NS, ROLE, craft, load_host, members_of, run

ENTRY = f"{NS}/{ROLE}/1/gen/r0-0000.manifest.json"


def _outside(tmp_path: Path) -> set[str]:
    """Every path below ``tmp_path``: what an unpack may not add to outside its target."""
    return {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")}


def _refused(tmp_path: Path, bundle: Path, member: str, why: str) -> None:
    """The bundle is refused when opened, unpacked and verified, naming ``member``; nothing is written anywhere."""
    before = _outside(tmp_path)
    with pytest.raises(BundleRefused) as info:
        BundleArchive(str(bundle))
    assert repr(member) in str(info.value) and why in str(info.value), str(info.value)
    with pytest.raises(BundleRefused, match=why):
        unpack(str(bundle), str(tmp_path / "target"))
    assert _outside(tmp_path) == before  # no target folder made, nothing beside it or above it


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Any]:
    module = load_host(tmp_path)
    yield module
    skipweave.unweave()


@pytest.fixture
def real(tmp_path: Path, host: Any) -> Path:
    """A bundle packed from a real recording (steps 1-3)."""
    dump = tmp_path / "dump"
    run(host, str(dump))
    return Path(pack(str(dump), str(tmp_path / "real.zip")).path)


def test_a_member_with_dot_dot_is_refused(tmp_path: Path) -> None:
    name = f"{NS}/{ROLE}/1/../../../../evil.manifest.json"
    _refused(tmp_path, craft(tmp_path / "b.zip", [(name, b"{}")]), name, "outside the bundle's folder")


def test_a_member_with_an_absolute_path_is_refused(tmp_path: Path) -> None:
    info = zipfile.ZipInfo("x")
    info.filename = "/tmp/evil.manifest.json"  # (ZipInfo strips a leading '/' from the name it is given)
    _refused(tmp_path, craft(tmp_path / "b.zip", [(info, b"{}")]), "/tmp/evil.manifest.json", "absolute path")


@pytest.mark.parametrize(("mode", "what"), [(stat.S_IFLNK | 0o777, "a symlink"),
                                            (stat.S_IFCHR | 0o666, "a character device")])
def test_a_symlink_or_device_member_is_refused(tmp_path: Path, mode: int, what: str) -> None:
    info = zipfile.ZipInfo(ENTRY)
    info.create_system = 3
    info.external_attr = mode << 16
    _refused(tmp_path, craft(tmp_path / "b.zip", [(info, b"/etc/passwd")]), ENTRY, what)


def test_duplicate_member_names_are_refused(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="Duplicate name"):  # (zipfile warns, and writes it all the same)
        bundle = craft(tmp_path / "b.zip", [(ENTRY, b"{}"), (ENTRY, b"{ }")])
    _refused(tmp_path, bundle, ENTRY, "appears twice")


def test_a_size_that_disagrees_with_the_bundle_manifest_is_refused(tmp_path: Path) -> None:
    data = b"{}"
    listed = [{"name": ENTRY, "bytes": len(data) + 1, "checksum": bytes_checksum(data)}]
    _refused(tmp_path, craft(tmp_path / "b.zip", [(ENTRY, data)], listed=listed), ENTRY,
             "has 2 bytes, the bundle manifest says 3")


def test_a_member_the_bundle_manifest_does_not_list_is_refused(tmp_path: Path) -> None:
    data = b"{}"
    _refused(tmp_path, craft(tmp_path / "b.zip", [(ENTRY, data)], listed=[]), ENTRY, "not listed")


def test_a_zip_bomb_is_refused_before_anything_is_inflated(tmp_path: Path) -> None:
    bundle = craft(tmp_path / "b.zip", [(ENTRY, bytes(16 << 20))], compress_type=zipfile.ZIP_DEFLATED)
    assert bundle.stat().st_size < (64 << 10)
    _refused(tmp_path, bundle, ENTRY, "zip bomb")


def test_a_truncated_bundle_is_refused(real: Path, tmp_path: Path) -> None:
    data = real.read_bytes()
    cut = tmp_path / "cut.zip"
    cut.write_bytes(data[: len(data) // 2])
    before = _outside(tmp_path)
    with pytest.raises(BundleRefused, match=r"bundle .*cut\.zip is truncated or not a zip archive"):
        BundleArchive(str(cut))
    with pytest.raises(BundleRefused, match="truncated"):
        unpack(str(cut), str(tmp_path / "target"))
    assert _outside(tmp_path) == before


def test_a_flipped_byte_in_a_payload_is_refused_everywhere_and_never_served(
        real: Path, tmp_path: Path, host: Any, capsys: pytest.CaptureFixture[str]) -> None:
    with BundleArchive(str(real)) as archive:
        victim = next(m for m in archive.members.values() if m.name.startswith(f"{NS}/{ROLE}/1/")
                      and m.name.endswith(".safetensors"))
    assert victim.offset is not None
    with open(real, "r+b") as fh:  # one byte of the tensor data, in place
        fh.seek(victim.offset + victim.bytes - 1)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))
    before = _outside(tmp_path)
    with pytest.raises(BundleRefused, match=rf"{victim.name!r}.*does not match its checksum"):
        unpack(str(real), str(tmp_path / "target"))
    assert _outside(tmp_path) == before
    assert main(["verify", str(real)]) == 1
    out = capsys.readouterr().out
    assert "CORRUPT" in out and victim.name in out
    with pytest.raises(skipweave.ReplayMissing, match="does not match its checksum"):  # replay-only: not served
        run(host, str(real), steps=(1,))
    assert host.CALLS == []
    assert _outside(tmp_path) == before  # nothing set aside, nothing written beside the bundle


def test_a_flipped_byte_in_the_bundle_manifest_is_refused(real: Path, tmp_path: Path) -> None:
    data = bytearray(real.read_bytes())
    at = data.index(b'"bundle_version"')
    data[at + 1] ^= 0x01  # "bundle_version" -> "cundle_version": valid JSON, but not what was vouched for
    real.write_bytes(bytes(data))
    _refused(tmp_path, real, "skipweave-bundle.json", "does not match the checksum the archive comment gives")


def test_a_payload_member_that_belongs_to_no_entry_is_refused(real: Path, tmp_path: Path) -> None:
    stray = f"{NS}/{ROLE}/1/gen/r0-0042.deadbeef.tree.json"
    bundle = craft(tmp_path / "stray.zip", [*members_of(real), (stray, b"{}")])
    BundleArchive(str(bundle)).close()  # a consistent archive...
    before = _outside(tmp_path)
    with pytest.raises(BundleRefused, match=rf"{stray!r}.*belongs to no entry"):  # ...whose member is no entry's
        unpack(str(bundle), str(tmp_path / "target"))
    assert not (tmp_path / "target").exists() or _outside(tmp_path) == before


def test_a_crafted_bundle_stops_a_run_before_any_patch(tmp_path: Path, host: Any) -> None:
    name = f"{NS}/{ROLE}/1/../../../../evil.manifest.json"
    bundle = craft(tmp_path / "b.zip", [(name, b"{}")])
    with pytest.raises(skipweave.ConfigError, match=r"skip\.rollout\.dump_dir.*outside the bundle's folder"):
        run(host, str(bundle))
    assert host.CALLS == []


def test_unpack_never_follows_a_symlink_out_of_the_target(real: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    (target / NS).symlink_to(outside)  # planted in the dump dir: unpack must not write through it
    from skipweave.store.errors import UnsafePath

    with pytest.raises(UnsafePath, match="symlink"):
        unpack(str(real), str(target))
    assert list(outside.iterdir()) == []
