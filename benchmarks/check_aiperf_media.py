"""Check that AIPerf loads mixed image + video + audio datasets unchanged and sends what we send.

    python -m venv /tmp/aiperf && /tmp/aiperf/bin/pip install aiperf==0.13.0
    python benchmarks/check_aiperf_media.py --aiperf-python /tmp/aiperf/bin/python

Writes small mixed datasets with ``pool`` and ``sliding-window`` (file paths, inline data and
URL delivery; single_turn and multi_turn), loads each with AIPerf's own custom-dataset loader
(offline: no tokenizer, no server) and renders every turn's chat content with AIPerf's chat
endpoint; then builds the same turns with ``mmdatagen.loadgen.payload`` and compares the
content parts (types, order, every URL and base64 payload) for single_turn datasets.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

AIPERF_SIDE = r"""
import json, sys
from aiperf.dataset.loader.multi_turn import MultiTurnDatasetLoader
from aiperf.dataset.loader.single_turn import SingleTurnDatasetLoader
from aiperf.endpoints.openai_chat import ChatEndpoint
path, out = sys.argv[1], sys.argv[2]
first = json.loads(open(path).readline())
cls = MultiTurnDatasetLoader if "turns" in first else SingleTurnDatasetLoader
loader = cls(filename=path)
endpoint = ChatEndpoint.__new__(ChatEndpoint)  # only the content-part hooks are used
parts = [endpoint._render_turn_content(turn)
         for conv in loader.convert_to_conversations(loader.load_dataset()) for turn in conv.turns]
json.dump(parts, open(out, "w"))
"""

CASES = {
    "pool-path": ["pool", "-n", "12", "--pool-size", "4", "--videos-per-request", "1",
                  "--audios-per-request", "1"],
    "pool-inline-webm-mp3": ["pool", "-n", "6", "--pool-size", "3", "--videos-per-request", "2",
                             "--audios-per-request", "1", "--delivery", "data-url",
                             "--video-format", "webm", "--audio-format", "mp3"],
    "pool-url": ["pool", "-n", "6", "--pool-size", "3", "--videos-per-request", "1",
                 "--audios-per-request", "1", "--delivery", "url", "--base-url", "http://h/m"],
    "sw-single": ["sliding-window", "--users", "3", "--turns", "3", "--window", "2",
                  "--videos-per-request", "1", "--audios-per-request", "1"],
    "sw-multi": ["sliding-window", "--users", "2", "--turns", "3", "--window", "1",
                 "--videos-per-request", "1", "--audios-per-request", "1", "--format",
                 "multi_turn", "--delivery", "path"],
}
SMALL = ["--image-size", "64x48", "--video-size", "128x96", "--video-frames", "4",
         "--audio-duration", "0.5", "--text-tokens", "12", "--tokenizer", "words", "-q", "-f"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aiperf-python", default=os.environ.get("AIPERF_PYTHON"),
                    help="python of a venv with aiperf==0.13.0 (or $AIPERF_PYTHON)")
    args = ap.parse_args()
    if not args.aiperf_python:
        ap.error("give --aiperf-python (a venv with aiperf==0.13.0 installed)")
    from mmdatagen.io.readers import iter_turns
    from mmdatagen.loadgen.payload import ImageEncoder, user_content

    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, cli in CASES.items():
            path = Path(tmp) / f"{name}.jsonl"
            subprocess.run([sys.executable, "-m", "mmdatagen", *cli, *SMALL, "-o", str(path)],
                           check=True, cwd=tmp, capture_output=True)
            out = Path(tmp) / f"{name}.parts.json"
            proc = subprocess.run([args.aiperf_python, "-c", AIPERF_SIDE, str(path), str(out)],
                                  capture_output=True, text=True, cwd=tmp)
            if proc.returncode != 0:
                print(f"{name}: AIPerf failed to load it:\n{proc.stderr[-2000:]}")
                failures += 1
                continue
            theirs = json.loads(out.read_text())
            counts = {t: sum(p["type"] == t for parts in theirs if isinstance(parts, list)
                             for p in parts) for t in ("image_url", "input_audio", "video_url")}
            verdict = "loaded"
            if "multi" not in name:  # multi_turn history is added per request, not per row
                encoder = ImageEncoder()
                cwd = os.getcwd()
                os.chdir(tmp)  # AIPerf resolves relative paths against its working directory
                try:
                    sessions: dict = {}  # AIPerf groups rows by session_id (first appearance)
                    for i, t in enumerate(iter_turns(path)):
                        sessions.setdefault(t.session_id or f"row-{i}", []).append(t)
                    ours = [user_content(t, encoder) for ts in sessions.values() for t in ts]
                finally:
                    os.chdir(cwd)
                same = ours == theirs
                failures += not same
                verdict += ", content parts identical to mmdatagen's" if same else \
                    ", CONTENT PARTS DIFFER from mmdatagen's"
            print(f"{name:22s} {len(theirs):3d} turns {counts}: {verdict}")
    print("all datasets load in AIPerf" + (" and match" if not failures else
                                            f"; {failures} problem(s)"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
