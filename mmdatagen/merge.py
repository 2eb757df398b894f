"""Join the shards of one dataset into the exact bytes a single process writes.

Shard files are named ``<stem>.shard-KKKKK-of-NNNNN.jsonl`` (``OutputSpec.final_path``), each
with its manifest. The JSONL is concatenated (streamed, flat memory); the manifest is rebuilt
the way ``generate`` builds an unsharded one: images sorted by id without duplicates, rows and
sessions concatenated, image uuids merged.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import UserError
from .io.atomic import atomic_open, check_target
from .io.manifest import manifest_path, read_manifest, write_manifest
from .plans.base import shard_range

SHARD_NAME = re.compile(r"^(?P<stem>.+)\.shard-(?P<index>\d{5,})-of-(?P<count>\d{5,})(?P<suffix>\.jsonl)?$")
# Manifest fields that each shard fills with its own part; every other field must agree.
PER_SHARD = ("shard", "images", "rows", "sessions", "image_uuids")
CHUNK = 1 << 20


@dataclass(frozen=True)
class Shard:
    """One shard file and its manifest."""

    path: Path
    manifest: dict[str, Any]

    @property
    def index(self) -> int:
        return int(self.manifest["shard"]["index"])


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
    """Read every shard's manifest; refuses files without one or with an unsharded one."""
    shards = []
    for path in map(Path, paths):
        if not path.is_file():
            raise UserError(f"shard {path} does not exist")
        manifest = read_manifest(path)
        if manifest is None:
            raise UserError(f"shard {path} has no manifest {manifest_path(path).name}")
        if not isinstance(manifest.get("shard"), dict):
            raise UserError(f"manifest of {path} has no shard section")
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
    ref = shards[0]
    count = int(ref.manifest["shard"]["num_shards"])
    total = int(ref.manifest["shard"]["total_lines"])
    for shard in shards[1:]:
        for key in sorted(set(ref.manifest) | set(shard.manifest)):
            if key in PER_SHARD or ref.manifest.get(key) == shard.manifest.get(key):
                continue
            what = "version" if key == "mmdatagen_version" else key
            detail = _first_difference(ref.manifest.get(key), shard.manifest.get(key))
            detail = f" ({detail})" if detail else ""
            raise UserError(f"{shard.path.name} does not belong with {ref.path.name}: "
                            f"different {what}{detail}")
        if int(shard.manifest["shard"]["num_shards"]) != count:
            raise UserError(f"{shard.path.name} is one of {shard.manifest['shard']['num_shards']} "
                            f"shards but {ref.path.name} is one of {count}")
        if int(shard.manifest["shard"]["total_lines"]) != total:
            raise UserError(f"{shard.path.name} does not belong with {ref.path.name}: different total lines")
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
    ordered = [seen[k] for k in range(count)]
    for k, shard in enumerate(ordered):
        span = shard_range(total, k, count)
        if list(shard.manifest["shard"]["lines"]) != [span.start, span.stop]:
            raise UserError(f"{shard.path.name} holds lines {shard.manifest['shard']['lines']}, "
                            f"expected [{span.start}, {span.stop}]")
    return ordered


def _merge_table(shards: list[Shard], key: str) -> list[dict[str, Any]]:
    """The union of the shards' image tables, sorted by id; the same id must agree everywhere."""
    table: dict[int, dict[str, Any]] = {}
    for shard in shards:
        for entry in shard.manifest.get(key) or []:
            image_id = int(entry["id"])
            if table.setdefault(image_id, entry) != entry:
                raise UserError(f"shards disagree on image {image_id} ({shard.path.name})")
    return [table[i] for i in sorted(table)]


def _merge_uuids(shards: list[Shard]) -> dict[str, str] | None:
    if shards[0].manifest.get("image_uuids") is None:
        return None
    merged: dict[int, str] = {}
    for shard in shards:
        for key, value in (shard.manifest.get("image_uuids") or {}).items():
            if merged.setdefault(int(key), value) != value:
                raise UserError(f"shards disagree on the uuid of image {key} ({shard.path.name})")
    return {str(i): merged[i] for i in sorted(merged)}


def merged_manifest(shards: list[Shard]) -> dict[str, Any]:
    """The manifest one process writes for the whole dataset (same key order)."""
    total = int(shards[0].manifest["shard"]["total_lines"])
    merged = dict(shards[0].manifest)
    merged["shard"] = {"index": 0, "num_shards": 1, "lines": [0, total], "total_lines": total}
    merged["images"] = _merge_table(shards, "images")
    merged["rows"] = [row for s in shards for row in s.manifest["rows"]]
    sessions = [s.manifest.get("sessions") for s in shards]
    merged["sessions"] = None if sessions[0] is None else [x for part in sessions for x in part]
    merged["image_uuids"] = _merge_uuids(shards)
    return merged


def _copy_counting(src: Path, fh) -> int:
    """Append ``src`` to ``fh`` in chunks; returns its number of lines."""
    lines = 0
    with open(src, "rb") as inp:
        while chunk := inp.read(CHUNK):
            lines += chunk.count(b"\n")
            fh.write(chunk)
    return lines


def merge(paths: list[Path], output: Path | None = None, force: bool = False) -> MergeResult:
    """Merge shard files (in any order) into ``output`` (default: the unsharded name) + manifest."""
    if not paths:
        if output is None:
            raise UserError("give shard files or --output to find them beside")
        paths = discover_shards(Path(output))
    shards = check_belong(load_shards([Path(p) for p in paths]))
    target = Path(output) if output is not None else unsharded_path(shards[0].path)
    resolved = {s.path.resolve() for s in shards}
    if target.resolve() in resolved or manifest_path(target).resolve() in resolved:
        raise UserError(f"output {target} would overwrite a shard")
    check_target(target, force)
    check_target(manifest_path(target), force)
    manifest = merged_manifest(shards)
    with atomic_open(target, "wb") as fh:
        for shard in shards:
            span = shard.manifest["shard"]["lines"]
            got = _copy_counting(shard.path, fh)
            if got != span[1] - span[0]:
                raise UserError(f"{shard.path.name} has {got} lines, its manifest says "
                                f"{span[1] - span[0]}")
    mpath = write_manifest(target, manifest)
    return MergeResult(target, mpath, len(shards), int(manifest["shard"]["total_lines"]))
