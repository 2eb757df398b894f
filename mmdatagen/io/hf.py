"""Hugging Face ``datasets`` output: a finished JSONL + manifest converted, never re-generated.

One example per request row (multi_turn: per turn) in file order, with the image bytes in an
``Image`` feature and every JSONL field beside them, so ``jsonl_rows`` rebuilds the JSONL
objects exactly. The manifest travels with the dataset (``mmdatagen.manifest.json`` in the
``save_to_disk`` folder; the Parquet file sits beside the JSONL and its manifest).
"""
from __future__ import annotations

import base64
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from ..errors import SpecError, UserError
from .atomic import check_not_input
from .manifest import manifest_path, read_manifest
from .readers import iter_objects
from .rows import session_object, turn_object

MANIFEST_NAME = "mmdatagen.manifest.json"
MIME = {"png": "image/png", "jpeg": "image/jpeg"}


def hf_dir(jsonl: Path) -> Path:
    """``data.jsonl`` -> ``data_hf/`` beside it (the ``save_to_disk`` folder)."""
    name = jsonl.name[:-6] if jsonl.name.endswith(".jsonl") else jsonl.name
    return jsonl.with_name(f"{name}_hf")


def parquet_path(jsonl: Path) -> Path:
    """``data.jsonl`` -> ``data.parquet`` beside it."""
    name = jsonl.name[:-6] if jsonl.name.endswith(".jsonl") else jsonl.name
    return jsonl.with_name(f"{name}.parquet")


def check_targets(jsonl: Path, parquet: bool, force: bool) -> list[Path]:
    """The paths ``write_hf`` will write; refuses existing ones without ``force``."""
    paths = [hf_dir(jsonl)] + ([parquet_path(jsonl)] if parquet else [])
    if paths[0].exists() and not paths[0].is_dir():
        raise UserError(f"{paths[0]} exists and is not a folder; the Hugging Face dataset is a "
                        "folder")
    if parquet and paths[1].is_dir():
        raise UserError(f"{paths[1]} is a directory")
    for path in paths:
        if path.exists() and not force:
            raise SpecError("force", f"is needed: {path} exists")
    check_not_input(paths)  # a folder replaced whole must not hold what the run reads
    return paths


def features(modalities: tuple[str, ...] = ()):
    """The dataset schema (``turn`` is null for single_turn rows).

    Datasets with videos or audios add ``videos`` (``Video`` feature, undecoded) / ``audios``
    (raw file bytes: ``datasets``' Audio feature needs torchcodec to store bytes), with their
    refs (the inline prefix ``data:video/mp4;base64,`` / ``wav,`` for inline items) and ids.
    """
    from datasets import Features, Image, List, Value, Video

    cols = {
        "line": Value("int64"), "turn": Value("int32"), "session_id": Value("string"),
        "text": Value("string"), "images": List(Image()), "image_refs": List(Value("string")),
        "image_ids": List(Value("int64")), "image_uuids": List(Value("string")),
        "output_length": Value("int64"),
    }
    if "video" in modalities:
        cols.update(videos=List(Video(decode=False)), video_refs=List(Value("string")),
                    video_ids=List(Value("int64")))
    if "audio" in modalities:
        cols.update(audios=List(Value("binary")), audio_refs=List(Value("string")),
                    audio_ids=List(Value("int64")))
    return Features(cols)


def _media_bytes(ref: str, image_dir: Path | None) -> tuple[bytes, str | None]:
    """(file bytes, inline prefix or None) of a video/audio reference."""
    if ref.startswith(("data:", "wav,", "mp3,")):
        prefix, b64 = ref.split(",", 1)
        return base64.b64decode(b64), prefix + ","
    return _image_bytes(ref, image_dir), None


def _image_bytes(ref: str, image_dir: Path | None) -> bytes:
    if ref.startswith("data:"):
        return base64.b64decode(ref.split(",", 1)[1])
    if image_dir is None:
        raise UserError("the HF writer needs the image folder for file or URL delivery")
    path = image_dir / ref.rsplit("/", 1)[-1]
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read image {path}: {exc.strerror}") from None


def _examples(jsonl: str, image_dir: str | None) -> Iterator[dict[str, Any]]:
    """Dataset examples from the JSONL, one per turn, with the manifest's image ids."""
    folder = Path(image_dir) if image_dir else None
    manifest = read_manifest(Path(jsonl), verify=False)  # checked once in build_dataset
    if manifest is None:
        raise UserError(f"{jsonl} has no manifest; the HF writer converts mmdatagen outputs")
    row = 0
    for line, obj in iter_objects(Path(jsonl)):
        multi = "turns" in obj
        for t, turn in enumerate(obj["turns"] if multi else [obj]):
            refs = turn.get("images", [])
            example = {
                "line": line, "turn": t if multi else None,
                "session_id": obj.get("session_id"), "text": turn.get("text", ""),
                "images": [{"bytes": _image_bytes(r, folder), "path": None} for r in refs],
                "image_refs": [None if r.startswith("data:") else r for r in refs],
                "image_ids": manifest.rows[row], "image_uuids": turn.get("image_uuids"),
                "output_length": turn.get("output_length"),
            }
            for modality, section in (manifest.media or {}).items():
                example.update(_media_fields(modality, turn.get(modality + "s", []), folder))
                example[modality + "_ids"] = section.rows[row]
            yield example
            row += 1


def _media_fields(modality: str, refs: list[str], folder: Path | None) -> dict[str, Any]:
    """A turn's videos (Video-like {bytes, path}) or audios (bytes), and their references."""
    got = [_media_bytes(r, folder) for r in refs]
    items: list[Any] = ([{"bytes": b, "path": None} for b, _ in got] if modality == "video"
                        else [b for b, _ in got])
    return {modality + "s": items,
            modality + "_refs": [p if p is not None else r for (_, p), r in zip(got, refs)]}


def build_dataset(jsonl: Path, image_dir: Path | None, work: Path):
    """A ``datasets.Dataset`` of the finished JSONL (arrow cache under ``work``)."""
    from datasets import Dataset, DatasetInfo

    manifest = read_manifest(jsonl)
    if manifest is None:
        raise UserError(f"{jsonl} has no manifest; the HF writer converts mmdatagen outputs")
    summary = {"mmdatagen_version": manifest.mmdatagen_version, "kind": manifest.kind,
               "format": manifest.format, "params": manifest.params, "seed": manifest.seed,
               "shard": manifest.shard.as_dict()}
    return Dataset.from_generator(
        _examples, features=features(tuple(manifest.media or ())), cache_dir=str(work),
        gen_kwargs={"jsonl": str(jsonl), "image_dir": str(image_dir) if image_dir else None},
        info=DatasetInfo(description=orjson.dumps(summary).decode()))


def write_hf(jsonl: Path, image_dir: Path | None, parquet: bool = False,
             force: bool = False) -> list[Path]:
    """Write ``<stem>_hf/`` (and ``<stem>.parquet``) for a finished dataset; returns the paths."""
    import datasets

    jsonl = Path(jsonl)
    written = check_targets(jsonl, parquet, force)
    target = written[0]
    datasets.disable_progress_bars()
    placed: list[Path] = []
    try:
        with tempfile.TemporaryDirectory(prefix=f".{target.name}.", dir=target.parent) as tmp:
            try:
                ds = build_dataset(jsonl, image_dir, Path(tmp) / "cache")
            except Exception as exc:  # datasets wraps a full disk, or our own error, in its own
                cause = exc.__cause__
                if isinstance(cause, (OSError, UserError)) and cause is not exc:
                    raise cause from None
                raise
            staged = Path(tmp) / "out"
            ds.save_to_disk(str(staged))
            (staged / MANIFEST_NAME).write_bytes(manifest_path(jsonl).read_bytes())
            if parquet:
                part = Path(tmp) / "data.parquet"
                ds.to_parquet(str(part))
                placed.append(written[1])
                part.replace(written[1])
            placed.append(target)  # from here on, an old copy (--force) goes too
            if target.exists():
                shutil.rmtree(target)
            staged.replace(target)
            del ds
    except BaseException:  # stopped while placing, or while removing the work folder: the
        for path in placed:  # caller removes the JSONL, so no copy of it may stay either
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        raise
    return written


def load(path: Path):
    """Load a dataset written by ``write_hf`` (the folder or the Parquet file)."""
    from datasets import Dataset, load_from_disk

    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        names = set(pq.read_schema(str(path)).names)
        modalities = tuple(m for m in ("video", "audio") if m + "s" in names)
        return Dataset.from_parquet(str(path), features=features(modalities))
    return load_from_disk(str(path))


def jsonl_rows(ds, image_format: str) -> list[dict[str, Any]]:
    """The JSONL objects the dataset was made from, rebuilt exactly (same keys, same order)."""
    from datasets import Image, List

    plain = ds.cast_column("images", List(Image(decode=False)))
    mime = MIME[image_format]
    lines: list[dict[str, Any]] = []
    current = -1
    for ex in plain:
        refs = [ref if ref is not None else
                f"data:{mime};base64,{base64.b64encode(img['bytes']).decode('ascii')}"
                for ref, img in zip(ex["image_refs"], ex["images"])]
        multi = ex["turn"] is not None
        media = {}
        for modality in ("video", "audio"):
            if modality + "s" not in ex:
                continue
            media[modality + "s"] = [
                ref + base64.b64encode(item["bytes"] if modality == "video" else item).decode("ascii")
                if ref.endswith(",") else ref
                for ref, item in zip(ex[modality + "_refs"], ex[modality + "s"])]
        turn = turn_object(ex["text"], refs, ex["image_uuids"], None if multi else ex["session_id"],
                           ex["output_length"], **media)
        if not multi:
            lines.append(turn)
        elif ex["line"] != current:
            lines.append(session_object(ex["session_id"], [turn]))
        else:
            lines[-1]["turns"].append(turn)
        current = ex["line"]
    return lines

