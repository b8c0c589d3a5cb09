"""Checkpoint folders on disk: publishing one safely, telling a whole one from a damaged one, keeping a few.

DeepSpeed writes a checkpoint's files; what makes the folder trustworthy is
ours. Every file is fsynced, then a manifest (each file's size and SHA-256) is
written last, then the folder is renamed into place and `latest` is replaced
atomically. A folder is whole only if its manifest matches it, so a torn write,
a truncated copy or a flipped byte is found before anything is loaded, and the
trainer falls back to the newest whole checkpoint. Tags sort by name (the
trainer's are `step000123`), newest last; `latest` names the one to try first.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from wmrl.core.files import fsync_dir, fsync_tree, write_atomic

__all__ = ["MANIFEST", "LATEST", "check_tag", "damage", "publish", "prune", "seal", "sweep", "tags"]

MANIFEST = "manifest.json"
LATEST = "latest"


def check_tag(tag: str) -> str:
    tag = str(tag)
    if not tag or tag.startswith(".") or "/" in tag or "\\" in tag or tag == LATEST:
        raise ValueError(f"invalid checkpoint tag {tag!r}: must be a plain, non-hidden directory name")
    return tag


def old_name(tag: str) -> str:
    """Where a tag being overwritten waits until its replacement is in place."""
    return f".{tag}.old"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def seal(folder: Path) -> None:
    """Make every file of `folder` durable, then write its manifest (last)."""
    fsync_tree(folder)
    entries = {p.relative_to(folder).as_posix(): [p.stat().st_size, _sha256(p)] for p in _files(folder)}
    write_atomic(folder / MANIFEST, json.dumps({"files": entries}))


def damage(folder: Path) -> str | None:
    """What is wrong with a checkpoint folder, or None if its manifest matches it.

    A folder without a manifest was written before manifests existed and is taken as whole.
    """
    path = folder / MANIFEST
    if not path.exists():
        return None
    try:
        files = json.loads(path.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its manifest is unreadable ({exc})"
    for rel, (size, digest) in files.items():
        p = folder / rel
        if not p.is_file():
            return f"{rel} is missing"
        if p.stat().st_size != size:
            return f"{rel} has {p.stat().st_size} bytes, not {size}"
        if _sha256(p) != digest:
            return f"{rel} does not match its checksum"
    extra = [p.relative_to(folder).as_posix() for p in _files(folder) if p.relative_to(folder).as_posix() not in files]
    return f"{extra[0]} is not in its manifest" if extra else None


def publish(directory: Path, staging: str, tag: str) -> None:
    """Rename the sealed `staging` folder to `tag` and point `latest` at it; a crash anywhere leaves the
    previous `latest` loadable (an overwritten tag waits as `.<tag>.old` until the swap is done)."""
    final, old = directory / tag, directory / old_name(tag)
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    (directory / staging).rename(final)
    fsync_dir(directory)
    write_atomic(directory / LATEST, tag)
    shutil.rmtree(old, ignore_errors=True)


def sweep(directory: Path) -> None:
    """Drop staging folders of crashed saves, and `.old` copies whose tag is back in place."""
    for p in directory.glob(".*.tmp"):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    for p in directory.glob(".*.old"):
        if (directory / p.name[1:-len(".old")]).is_dir():
            shutil.rmtree(p, ignore_errors=True)


def tags(directory: str | Path) -> list[tuple[str, Path]]:
    """(tag, folder) of every checkpoint in `directory`, the one `latest` names first, then newest first.

    A tag caught mid-swap while being overwritten is found in its `.old` copy.
    """
    directory = Path(directory)
    found: dict[str, Path] = {}
    if directory.is_dir():
        for p in directory.iterdir():
            if p.is_dir() and not p.name.startswith("."):
                found[p.name] = p
        for p in directory.glob(".*.old"):
            found.setdefault(p.name[1:-len(".old")], p)
    order = sorted(found, reverse=True)
    try:
        first = (directory / LATEST).read_text().strip()
    except OSError:
        first = ""
    if first in found:
        order.remove(first)
        order.insert(0, first)
    return [(t, found[t]) for t in order]


def prune(directory: Path, keep: int) -> list[str]:
    """Remove all but the newest `keep` checkpoints (and never the one `latest` names); what was removed."""
    if keep <= 0:
        return []
    listed = tags(directory)
    protected = {listed[0][0]} if listed else set()
    newest = sorted((t for t, _ in listed), reverse=True)[:keep]
    removed = [t for t, p in listed if t not in newest and t not in protected]
    for t in removed:
        shutil.rmtree(directory / t, ignore_errors=True)
    return removed
