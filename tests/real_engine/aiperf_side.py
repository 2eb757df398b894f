"""Run by AIPerf's own interpreter: load a dataset with AIPerf's loader, render every turn's content.

Usage: ``python aiperf_side.py DATASET.jsonl OUT.json``. Offline: no tokenizer, no server. The
content parts are what AIPerf's chat endpoint would put in each request's last user message.
"""
import json
import sys

from aiperf.dataset.loader.multi_turn import MultiTurnDatasetLoader
from aiperf.dataset.loader.single_turn import SingleTurnDatasetLoader
from aiperf.endpoints.openai_chat import ChatEndpoint

path, out = sys.argv[1], sys.argv[2]
with open(path) as f:
    first = json.loads(f.readline())
loader_cls = MultiTurnDatasetLoader if "turns" in first else SingleTurnDatasetLoader
loader = loader_cls(filename=path)
endpoint = ChatEndpoint.__new__(ChatEndpoint)  # only the content-rendering hook is used
conversations = loader.convert_to_conversations(loader.load_dataset())
parts = [endpoint._render_turn_content(turn) for conv in conversations for turn in conv.turns]
with open(out, "w") as f:
    json.dump(parts, f)
