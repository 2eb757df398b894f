"""Join the shards of one dataset into the exact bytes a single process writes.

Shard files are named ``<stem>.shard-KKKKK-of-NNNNN.jsonl`` (``OutputSpec.final_path``), each
with its manifest. The JSONL is concatenated (streamed, flat memory); the manifest is rebuilt
the way ``generate`` builds an unsharded one: images sorted by id without duplicates, rows and
sessions concatenated, image uuids merged.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import blake3

from .errors import UserError
from .io.atomic import atomic_group, check_not_input, check_target, output_lock
from .io.manifest import (
    MANIFEST_SUFFIX,
    HashingWriter,
    ImageEntry,
    Manifest,
    MediaEntry,
    MediaSection,
    ShardInfo,
    dump,
    manifest_path,
    read_manifest,
)
from .plans.base import shard_range

SHARD_NAME = re.compile(r"^(?P<stem>.+)\.shard-(?P<index>\d{5,})-of-(?P<count>\d{5,})(?P<suffix>\.jsonl)?$")
CHUNK = 1 << 20


@dataclass(frozen=True)
class Shard:
    """One shard file and its manifest."""

    path: Path
    manifest: Manifest

    @property
    def index(self) -> int:
        return self.manifest.shard.index


@dataclass(frozen=True)
class MergeResult:
    """What a merge wrote."""

    path: Path
    manifest: Path
    shards: int
    lines: int


def unsharded_path(shard: Path) -> Path:
    """``d.shard-00001-of-00004.jsonl`` -> ``d.jsonl``; refuses names that are not shard names."""
    match = SHARD_NAME.match(Path(shard).name)
    if not match:
        raise UserError(f"{shard} is not a shard file name (<name>.shard-KKKKK-of-NNNNN.jsonl)")
    return Path(shard).with_name(match["stem"] + (match["suffix"] or ""))


def discover_shards(output: Path) -> list[Path]:
    """The shard files written beside ``output`` for it (any shard count), sorted by name."""
    output = Path(output)
    stem, suffix = output.name, ""
    if stem.endswith(".jsonl"):
        stem, suffix = stem[:-6], ".jsonl"
    parent = output.parent if str(output.parent) else Path(".")
    found = sorted(p for p in parent.glob(f"{glob_escape(stem)}.shard-*-of-*{suffix}")
                   if SHARD_NAME.match(p.name) and unsharded_path(p).name == output.name)
    if not found:
        raise UserError(f"no shards of {output} found (expected {stem}.shard-KKKKK-of-NNNNN{suffix})")
    return found


def glob_escape(text: str) -> str:
    """Escape glob metacharacters in a literal file name part."""
    return re.sub(r"([*?\[])", r"[\1]", text)


def load_shards(paths: list[Path]) -> list[Shard]:
    """Read every shard's manifest; refuses files without one. The shards' bytes are checked
    against their manifests' hashes while they are copied (see :func:`merge`)."""
    shards = []
    for path in map(Path, paths):
        if not path.is_file():
            raise UserError(f"shard {path} does not exist")
        manifest = read_manifest(path, verify=False)
        if manifest is None:
            raise UserError(f"shard {path} has no manifest {manifest_path(path).name}")
        if manifest.jsonl is None:
            raise UserError(f"manifest of {path} records no content hash")
        shards.append(Shard(path, manifest))
    return shards


def _first_difference(a: Any, b: Any) -> str:
    """The first key whose values differ between two mappings (for a readable error)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if a.get(key) != b.get(key):
                return str(key)
    return ""


def check_belong(shards: list[Shard]) -> list[Shard]:
    """Shards sorted by index, or a one-line error when they are not one complete dataset."""
    if not shards:
        raise UserError("no shards to merge")
    for shard in shards[1:]:
        _check_same_dataset(shards[0], shard)
    ordered = _in_order(shards, shards[0].manifest.shard.num_shards)
    total = shards[0].manifest.shard.total_lines
    for k, shard in enumerate(ordered):
        span = shard_range(total, k, len(ordered))
        if shard.manifest.shard.lines != (span.start, span.stop):
            raise UserError(f"{shard.path.name} holds lines {list(shard.manifest.shard.lines)}, "
                            f"expected [{span.start}, {span.stop}]")
    return ordered


def _check_same_dataset(ref: Shard, shard: Shard) -> None:
    """Refuse a shard whose parameters, version, shard count or total differ from ``ref``'s."""
    ref_id, other = ref.manifest.identity(), shard.manifest.identity()
    for key in sorted(set(ref_id) | set(other)):
        if ref_id.get(key) == other.get(key):
            continue
        what = "version" if key == "mmdatagen_version" else key
        detail = _first_difference(ref_id.get(key), other.get(key))
        detail = f" ({detail})" if detail else ""
        raise UserError(f"{shard.path.name} does not belong with {ref.path.name}: "
                        f"different {what}{detail}")
    count = ref.manifest.shard.num_shards
    if shard.manifest.shard.num_shards != count:
        raise UserError(f"{shard.path.name} is one of {shard.manifest.shard.num_shards} "
                        f"shards but {ref.path.name} is one of {count}")
    if shard.manifest.shard.total_lines != ref.manifest.shard.total_lines:
        raise UserError(f"{shard.path.name} does not belong with {ref.path.name}: different total lines")


def _in_order(shards: list[Shard], count: int) -> list[Shard]:
    """Shards 0..count-1, each exactly once."""
    seen: dict[int, Shard] = {}
    for shard in shards:
        if shard.index in seen:
            raise UserError(f"duplicate shard {shard.index}: {seen[shard.index].path.name} and "
                            f"{shard.path.name}")
        seen[shard.index] = shard
    missing = [k for k in range(count) if k not in seen]
    if missing:
        names = ", ".join(str(k) for k in missing[:10]) + (", ..." if len(missing) > 10 else "")
        raise UserError(f"missing shard(s) {names} of {count}")
    if len(seen) != count:
        raise UserError(f"expected {count} shards, got {len(seen)}")
    return [seen[k] for k in range(count)]


def _merge_table(shards: list[Shard]) -> list[ImageEntry]:
    """The union of the shards' image tables, sorted by id; the same id must agree everywhere."""
    table: dict[int, ImageEntry] = {}
    for shard in shards:
        for entry in shard.manifest.images:
            image_id = entry.id
            if table.setdefault(image_id, entry) != entry:
                raise UserError(f"shards disagree on image {image_id} ({shard.path.name})")
    return [table[i] for i in sorted(table)]


def _merge_uuids(shards: list[Shard]) -> dict[str, str] | None:
    if shards[0].manifest.image_uuids is None:
        return None
    merged: dict[int, str] = {}
    for shard in shards:
        for key, value in (shard.manifest.image_uuids or {}).items():
            if merged.setdefault(int(key), value) != value:
                raise UserError(f"shards disagree on the uuid of image {key} ({shard.path.name})")
    return {str(i): merged[i] for i in sorted(merged)}


def _merge_sessions(shards: list[Shard]) -> list[str] | None:
    parts = [s.manifest.sessions for s in shards]
    if any(part is None for part in parts):
        return None
    return [x for part in parts if part is not None for x in part]


def merged_manifest(shards: list[Shard]) -> Manifest:
    """The manifest one process writes for the whole dataset (its ``jsonl`` filled by merge)."""
    total = shards[0].manifest.shard.total_lines
    return replace(shards[0].manifest, shard=ShardInfo(0, 1, (0, total), total),
                   images=_merge_table(shards),
                   rows=[row for s in shards for row in s.manifest.rows],
                   sessions=_merge_sessions(shards),
                   image_uuids=_merge_uuids(shards), jsonl=None,
                   media=_merge_media(shards) if shards[0].manifest.media is not None else None)


def _sections(shard: Shard, modality: str) -> MediaSection:
    section = (shard.manifest.media or {}).get(modality)
    if section is None:  # check_belong compared the styles, so this is a shard made by hand
        raise UserError(f"{shard.path.name} has no {modality} section")
    return section


def _merge_media(shards: list[Shard]) -> dict[str, MediaSection]:
    """Join the shards' video/audio sections (styles already agree): items united by id, rows
    concatenated."""
    merged: dict[str, MediaSection] = {}
    for modality, first in (shards[0].manifest.media or {}).items():
        items: dict[int, MediaEntry] = {}
        for shard in shards:
            for entry in _sections(shard, modality).items:
                if items.setdefault(entry.id, entry) != entry:
                    raise UserError(f"shards disagree on {modality} {entry.id} ({shard.path.name})")
        rows = [row for s in shards for row in _sections(s, modality).rows]
        merged[modality] = MediaSection(first.style, [items[i] for i in sorted(items)], rows)
    return merged


def _copy_verified(shard: Shard, fh) -> None:
    """Append a shard to ``fh`` in chunks, checking its line count and blake3 hash against
    its manifest: a corrupted, truncated or replaced shard is refused."""
    lines = 0
    hasher = blake3.blake3()
    with open(shard.path, "rb") as inp:
        while chunk := inp.read(CHUNK):
            lines += chunk.count(b"\n")
            hasher.update(chunk)
            fh.write(chunk)
    start, stop = shard.manifest.shard.lines
    if lines != stop - start:
        raise UserError(f"{shard.path.name} has {lines} lines, its manifest says {stop - start}")
    want = shard.manifest.jsonl
    if want is not None and hasher.hexdigest() != want.blake3:
        raise UserError(f"{shard.path.name} does not match its manifest (blake3 differs): the "
                        "shard was modified or corrupted after it was written")


def merge(paths: list[Path], output: Path | None = None, force: bool = False) -> MergeResult:
    """Merge shard files (in any order) into ``output`` (default: the unsharded name) + manifest."""
    if not paths:
        if output is None:
            raise UserError("no shard files given and no output to find them beside")
        paths = discover_shards(Path(output))
    shards = check_belong(load_shards([Path(p) for p in paths]))
    target = Path(output) if output is not None else unsharded_path(shards[0].path)
    check_not_input([target, manifest_path(target)],
                    [p for s in shards for p in (s.path, manifest_path(s.path))])
    manifest = merged_manifest(shards)
    with output_lock(target), atomic_group() as open_:
        check_target(target, force, longest_suffix=MANIFEST_SUFFIX)
        check_target(manifest_path(target), force)
        with open_(target) as raw:
            fh = HashingWriter(raw)
            for shard in shards:
                _copy_verified(shard, fh)
        manifest = replace(manifest, jsonl=fh.result())
        with open_(manifest_path(target)) as mfh:
            mfh.write(dump(manifest))
    return MergeResult(target, manifest_path(target), len(shards), manifest.shard.total_lines)
