"""notebooks/cache_sizing.ipynb: stored without outputs and runs end to end."""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "cache_sizing.ipynb"


def test_notebook_is_stored_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


@pytest.mark.slow
def test_notebook_runs_end_to_end(tmp_path):
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "qwen3-vl-30b-a3b" in text and "recommended" in text and "TTFT" in text
    assert any("image/png" in o.get("data", {}) for o in outputs), "the plot is drawn"
    # the summary line: the hit rate of both tiers near seed A's 80 % and a faster TTFT than
    # with Dynamo's cache off
    line = next(ln for ln in text.splitlines() if ln.startswith("At "))
    match = re.search(r"hit rate ([\d.]+)%, TTFT (\d+) ms \(vs (\d+) ms", line)
    assert match, line
    assert 75 <= float(match[1]) <= 81 and int(match[2]) < int(match[3]), line
    # the tiers: vLLM's encoder cache (54 images of Qwen3-VL's 300 tokens) serves about a fifth
    # of the images in both runs, Dynamo's cache the other repeats; with it off they are encoded
    line = next(ln for ln in text.splitlines() if ln.startswith("Tiers: "))
    match = re.search(r"encoder cache served (\d+) images and Dynamo's cache (\d+), (\d+) were "
                      r"encoded; .* alone served (\d+) \(([\d.]+)%\) and (\d+) were encoded", line)
    assert match, line
    front, dynamo, encoded, front_off, share_off, encoded_off = (float(g) for g in match.groups())
    assert abs(front - front_off) <= 0.05 * front_off and 15 <= share_off <= 30, line
    assert dynamo > 0 and encoded == 200, line  # only the compulsory misses are encoded
    assert front + dynamo + encoded == front_off + encoded_off, line  # the same images
    # the analysis table: the front tier's budget (vLLM's rule) and the share it serves alone
    row = next(ln for ln in text.splitlines() if ln.startswith("qwen3-vl-30b-a3b "))
    assert re.search(r"16,384\s+54\s+21\.8%\s+74\.4%\s+80\.0%", row), row
