"""Item-reference traces: which cache key each request looks up, in order, with item sizes.

Built from a plan (no pixels), from a manifest written beside a dataset, or by streaming any
AIPerf JSONL and identifying each image as an engine would (``KEY_MODES`` of ``io/imageref``).
Videos and audio clips are objects of the same trace (``modality``; see ``analysis.media``).
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ..caches.entries import entry_size
from ..errors import DatasetError, SpecError, UserError
from ..io import imageref
from ..io.manifest import Manifest, MediaSection
from ..io.readers import Turn, detect_format, iter_turns
from ..vlm import VisionModel


@dataclass
class Trace:
    """References in file order: ``ids[i]`` is the object (cache key) of reference i, made by
    request ``ref_row[i]`` (non-decreasing). Per object: ``widths``/``heights`` (0 = unknown).
    ``sessions`` per row (None: every row its own session). ``modality`` per object (codes of
    ``media.MODALITIES``; None: images only) and ``media`` its per-object video/audio values
    (frames, fps, width, height, samples, sample_rate)."""

    ids: np.ndarray
    ref_row: np.ndarray
    num_rows: int
    widths: np.ndarray
    heights: np.ndarray
    sessions: np.ndarray | None = None
    source: str = ""
    info: dict = field(default_factory=dict)
    modality: np.ndarray | None = None
    media: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def num_objects(self) -> int:
        return int(self.widths.size)

    @property
    def row_start(self) -> np.ndarray:
        """Where each row's references start, and the end (``num_rows + 1`` values)."""
        counts = np.bincount(self.ref_row, minlength=self.num_rows)[: self.num_rows]
        out = np.zeros(self.num_rows + 1, np.int64)
        np.cumsum(counts, out=out[1:])
        return out

    def row_refs(self) -> list[np.ndarray]:
        """Object ids per row."""
        bounds = np.searchsorted(self.ref_row, np.arange(1, self.num_rows))
        return np.split(self.ids, bounds)

    def reordered(self, rows: np.ndarray) -> Trace:
        """The trace with requests in the given order (e.g. dispatch order)."""
        rows = np.asarray(rows, np.int64)
        lens = np.bincount(self.ref_row, minlength=self.num_rows)
        starts = np.cumsum(lens) - lens
        new_lens = lens[rows]
        new_starts = np.cumsum(new_lens) - new_lens
        offset = np.arange(int(new_lens.sum())) - np.repeat(new_starts, new_lens)
        ids = self.ids[np.repeat(starts[rows], new_lens) + offset]
        sessions = None if self.sessions is None else self.sessions[rows]
        return Trace(ids, np.repeat(np.arange(rows.size), new_lens), int(rows.size), self.widths,
                     self.heights, sessions, self.source, dict(self.info), self.modality,
                     self.media)

    def costs(self, model: VisionModel, real_width: bool = False,
              unknown_size: tuple[int, int] | None = None,
              target=None) -> tuple[np.ndarray, np.ndarray]:
        """(entry size, encoder tokens) per object under ``model``: the entry in ``target``'s
        unit (``caches.entries.entry_size``; default embedding bytes); videos and audio clips by
        ``media.media_costs``."""
        images = np.ones(self.num_objects, bool) if self.modality is None else self.modality == 0
        w, h = self.widths.astype(np.int64), self.heights.astype(np.int64)
        unknown = images & ((w <= 0) | (h <= 0))
        if unknown.any() and model.tokens_per_image is None:
            if unknown_size is None:
                raise SpecError("url_image_size", f"WxH is needed: {int(unknown.sum())} image(s) "
                                "have unknown dimensions (http URLs or uuid-only references)")
            w, h = np.where(unknown, unknown_size[0], w), np.where(unknown, unknown_size[1], h)
        byt = np.zeros(self.num_objects, np.int64)
        tok = np.zeros(self.num_objects, np.int64)
        byt[images], tok[images] = _image_costs(model, w[images], h[images], real_width, target)
        if self.modality is not None and not images.all():
            from .media import media_costs

            byt[~images], tok[~images] = media_costs(model, target, self.modality, self.media,
                                                     ~images)
        return byt, tok


def _image_costs(model: VisionModel, w: np.ndarray, h: np.ndarray, real_width: bool,
                 target) -> tuple[np.ndarray, np.ndarray]:
    if w.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    pairs, inv = np.unique(np.stack([w, h], 1), axis=0, return_inverse=True)
    tok = np.array([model.image_tokens(int(a), int(b)) for a, b in pairs], np.int64)
    if target is None:
        byt = np.array([model.entry_bytes(int(a), int(b), real_width) for a, b in pairs],
                       np.int64)
    else:
        byt = np.array([entry_size(target, model, int(a), int(b), real_width)
                        for a, b in pairs], np.int64)
    inv = inv.reshape(-1)
    return byt[inv], tok[inv]


def _dense(values: Iterable) -> np.ndarray:
    """Integers by first appearance for arbitrary hashable labels."""
    table: dict = {}
    return np.fromiter((table.setdefault(v, len(table)) for v in values), np.int64)


def _with_history(row_refs: list[list[int]], sessions: list) -> list[list[int]]:
    """multi_turn: every request resends its session's earlier images before its own."""
    seen: dict = {}
    out = []
    for refs, sid in zip(row_refs, sessions):
        hist = seen.setdefault(sid, [])
        out.append(hist + refs)
        hist.extend(refs)
    return out


def _build(row_refs: list[list[int]], widths, heights, sessions: list | None, source: str,
           info: dict) -> Trace:
    lens = np.fromiter((len(r) for r in row_refs), np.int64, len(row_refs))
    ids = np.fromiter((x for r in row_refs for x in r), np.int64, int(lens.sum()))
    sess = None if sessions is None else _dense(sessions)
    return Trace(ids, np.repeat(np.arange(len(row_refs)), lens), len(row_refs),
                 np.asarray(widths, np.int64), np.asarray(heights, np.int64), sess, source, info)


def trace_from_plan(plan, styles: dict | None = None) -> Trace:
    """A plan's references in file order (every plan image id is one distinct picture); its
    videos and audio clips (``plan.media``) after the images, sized by ``styles`` (the
    generator's ``VideoStyle`` / ``AudioStyle``: frames, fps, samples, sample rate)."""
    rows, k = plan.image_ids.shape
    sessions = None if plan.sessions is None else plan.sessions.astype(np.int64)
    info = {"kind": plan.kind, "params": dict(plan.params), "key_mode": "image id (plan)"}
    if not plan.media:
        return Trace(plan.image_ids.reshape(-1).astype(np.int64), np.repeat(np.arange(rows), k),
                     rows, plan.widths.astype(np.int64), plan.heights.astype(np.int64),
                     sessions, f"{plan.kind} plan", info)
    table = _MediaTable(plan.num_images)
    widths, heights = [int(x) for x in plan.widths], [int(x) for x in plan.heights]
    row_refs = [[int(x) for x in r] for r in plan.image_ids]
    for code, name in ((1, "audio"), (2, "video")):
        m = plan.media.get(name)
        if m is not None:
            table.add(code, name, _plan_section(m, (styles or {}).get(name)), row_refs, "plan")
    info["key_mode"] = "item id (plan)"
    trace = _build(row_refs, widths + table.widths, heights + table.heights,
                   None if sessions is None else sessions.tolist(), f"{plan.kind} plan", info)
    trace.modality, trace.media = table.arrays()
    return trace


def _plan_section(m, style) -> SimpleNamespace:
    """A plan's MediaPlan shaped as a manifest media section (items with their sizing values)."""
    items = []
    for i in range(m.num_items):
        if m.modality == "video":
            items.append(SimpleNamespace(id=i, width=int(m.widths[i]), height=int(m.heights[i]),
                                         frames=style.num_frames, fps=style.fps))
        else:
            items.append(SimpleNamespace(id=i, samples=style.num_samples,
                                         sample_rate=style.sample_rate))
    return SimpleNamespace(items=items, rows=m.ids.tolist())


def trace_from_manifest(manifest: Manifest, source: str = "manifest") -> Trace:
    """References from a manifest: its ``rows`` of pool ids and ``images``, then each row's
    audio clips and videos from its media section (no image or clip is read)."""
    images = manifest.images
    index = {im.id: i for i, im in enumerate(images)}
    widths = [im.width for im in images]
    heights = [im.height for im in images]
    try:
        rows = [[index[x] for x in row] for row in manifest.rows]
    except KeyError as exc:
        raise DatasetError(f"{source}: malformed manifest (row image {exc} not in its image "
                           "table)") from None
    media = _MediaTable(len(images))
    for code, name in ((1, "audio"), (2, "video")):
        section = (manifest.media or {}).get(name)
        if section is not None:
            media.add(code, name, section, rows, source)
    sessions = manifest.sessions
    if manifest.format == "multi_turn":
        rows = _with_history(rows, sessions or list(range(len(rows))))
    info = {"kind": manifest.kind, "params": manifest.params,
            "manifest": True, "key_mode": "image id (manifest)"}
    trace = _build(rows, widths + media.widths, heights + media.heights, sessions, source, info)
    if manifest.media:
        trace.modality, trace.media = media.arrays()
        info["key_mode"] = "item id (manifest)"
    return trace


class _MediaTable:
    """Video and audio objects of a manifest, numbered after its images."""

    FIELDS = ("frames", "fps", "width", "height", "samples", "sample_rate")

    def __init__(self, num_images: int) -> None:
        self.codes = [0] * num_images
        self.values: dict[str, list] = {k: [0] * num_images for k in self.FIELDS}
        self.widths: list[int] = []
        self.heights: list[int] = []

    def add(self, code: int, name: str, section: MediaSection | SimpleNamespace, rows: list[list[int]],
            source: str) -> None:
        base = len(self.codes)
        index = {}
        for k, item in enumerate(section.items):
            index[item.id] = base + k
            self.codes.append(code)
            for f in self.FIELDS:
                self.values[f].append(getattr(item, f, 0) or 0)
            self.widths.append(int(getattr(item, "width", 0) or 0))
            self.heights.append(int(getattr(item, "height", 0) or 0))
        if len(section.rows) != len(rows):
            raise DatasetError(f"{source}: malformed manifest ({name} rows do not match rows)")
        try:
            for row, ids in zip(rows, section.rows):
                row.extend(index[int(x)] for x in ids)
        except KeyError as exc:
            raise DatasetError(f"{source}: malformed manifest (row {name} {exc} not in its "
                               "item table)") from None

    def arrays(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        return (np.asarray(self.codes, np.int64),
                {k: np.asarray(v, np.float64 if k == "fps" else np.int64)
                 for k, v in self.values.items()})


class _Identifier:
    """Dense object ids for item references under one key mode (image identity:
    ``io/imageref``; videos and audio clips by the blake3 of their bytes, or by the reference
    string under "reference"), with the values that size each object."""

    def __init__(self, mode: str, dataset_dir: Path | None):
        if mode not in imageref.KEY_MODES:
            raise UserError(f"unknown key mode {mode!r}; choose from {', '.join(imageref.KEY_MODES)}")
        self.mode, self.dataset_dir = mode, dataset_dir
        self.identify = imageref.ImageIdentifier(mode, dataset_dir)
        self.by_key: dict = {}
        self.widths: list[int] = []
        self.heights: list[int] = []
        self.table = _MediaTable(0)
        self.refs: dict = {}  # video/audio reference string (or its digest) -> object id

    @property
    def saw_uuids(self) -> bool:
        return self.identify.saw_uuids

    def __call__(self, ref: str, uuid: str | None) -> int:
        ident = self.identify(ref, uuid)
        oid = self._object(ident.key, ident.width, ident.height, 0, {})
        if self.widths[oid] <= 0 < ident.width:
            self.widths[oid], self.heights[oid] = ident.width, ident.height
        return oid

    def _object(self, key, width: int, height: int, code: int, values: dict) -> int:
        oid = self.by_key.get(key)
        if oid is None:
            oid = self.by_key[key] = len(self.widths)
            self.widths.append(width)
            self.heights.append(height)
            self.table.codes.append(code)
            for f in _MediaTable.FIELDS:
                self.table.values[f].append(values.get(f, 0))
        return oid

    def video(self, ref: str) -> int:
        memo = ref if len(ref) < 4096 else _digest(ref.encode())
        if memo not in self.refs:
            self.refs[memo] = self._video(ref)
        return self.refs[memo]

    def audio(self, ref: str) -> int:
        memo = ref if len(ref) < 4096 else _digest(ref.encode())
        if memo not in self.refs:
            self.refs[memo] = self._audio(ref)
        return self.refs[memo]

    def _video(self, ref: str) -> int:
        from ..io import mediaref

        if ref.startswith(("http://", "https://")):
            frames, fps, w, h = mediaref.REMOTE_VIDEO
            return self._object(("ref", ref), w, h, 2, {"frames": frames, "fps": fps,
                                                         "width": w, "height": h})
        data = mediaref.decode_video_url(ref) if ref.startswith("data:") else \
            imageref.resolve_path(ref, self.dataset_dir).read_bytes()
        key = ("ref", ref) if self.mode == "reference" else ("video", _digest(data))
        if key in self.by_key:
            return self.by_key[key]
        v = mediaref.video_info(data)
        return self._object(key, v.width, v.height, 2, {"frames": v.frames, "fps": v.fps,
                                                        "width": v.width, "height": v.height})

    def _audio(self, ref: str) -> int:
        from ..io import mediaref

        head, sep, body = ref.partition(",")
        if sep and head.lower() in ("wav", "mp3"):
            fmt, data = head.lower(), mediaref.decode_b64(body, "audio")
        elif ref.startswith("data:audio/"):
            fmt = head[len("data:audio/"):].split(";", 1)[0] or "wav"
            data = mediaref.decode_b64(body, "audio data URL")
        else:
            path = imageref.resolve_path(ref, self.dataset_dir)
            fmt, data = path.suffix.lower().lstrip("."), path.read_bytes()
        key = ("ref", ref) if self.mode == "reference" else ("audio", _digest(data))
        if key in self.by_key:
            return self.by_key[key]
        a = mediaref.audio_info(data, fmt)
        return self._object(key, 0, 0, 1, {"samples": a.samples, "sample_rate": a.sample_rate})


def _digest(data: bytes) -> bytes:
    import blake3

    return blake3.blake3(data).digest()


def trace_from_dataset(path: Path, key_mode: str = "bytes", fmt: str = "auto",
                       progress: Callable[[int], None] | None = None) -> Trace:
    """Stream an AIPerf JSONL and identify every image as an engine keyed by ``key_mode`` would.

    ``progress`` is called with an estimate of the bytes consumed per row.
    """
    path = Path(path)
    ident = _Identifier(key_mode, path.resolve().parent)
    detected = detect_format(path) if fmt == "auto" else fmt
    row_refs: list[list[int]] = []
    sessions: list = []
    for n, turn in enumerate(iter_turns(path, detected)):
        row_refs.append(_turn_refs(turn, ident, f"{path.name}:{turn.line_no}"))
        sessions.append(turn.session_id if turn.session_id is not None else ("row", n))
        if progress is not None:
            progress(sum(map(len, (*turn.images, *turn.texts, *turn.audios, *turn.videos))) + 64)
    if detected == "multi_turn":
        row_refs = _with_history(row_refs, sessions)
    if not row_refs:
        raise DatasetError(f"{path}: no rows")
    has_sessions = any(not isinstance(s, tuple) for s in sessions)
    info = {"kind": "dataset", "format": detected, "key_mode": key_mode, "manifest": False,
            "image_uuids": ident.saw_uuids}
    trace = _build(row_refs, ident.widths, ident.heights, sessions if has_sessions else None,
                   str(path), info)
    if any(ident.table.codes):
        trace.modality, trace.media = ident.table.arrays()
    return trace


def _turn_refs(turn: Turn, ident: _Identifier, where: str) -> list[int]:
    uuids = turn.image_uuids
    images = turn.images
    if uuids is not None and not images:
        images = [""] * len(uuids)  # cache-only references
    out = []
    try:
        for i, ref in enumerate(images):
            out.append(ident(ref, uuids[i] if uuids else None))
        out += [ident.audio(ref) for ref in turn.audios if ref]  # AIPerf's order of parts
        out += [ident.video(ref) for ref in turn.videos if ref]
    except DatasetError as exc:
        raise DatasetError(f"{where}: {exc}") from None
    except OSError as exc:
        raise DatasetError(f"{where}: cannot read {exc.filename}: {exc.strerror}") from None
    return out


def dataset_size(path: Path) -> int | None:
    """Bytes on disk for progress totals (None for compressed files, whose total is unknown)."""
    path = Path(path)
    return None if path.suffix == ".gz" else os.path.getsize(path)
