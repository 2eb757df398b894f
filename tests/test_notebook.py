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
    # the summary line: hit rate near seed A's 80 % and a faster TTFT than without a cache
    line = next(ln for ln in text.splitlines() if ln.startswith("At "))
    match = re.search(r"hit rate ([\d.]+)%, TTFT (\d+) ms \(vs (\d+) ms", line)
    assert match, line
    assert 75 <= float(match[1]) <= 81 and int(match[2]) < int(match[3]), line
