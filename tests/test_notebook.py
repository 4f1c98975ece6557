"""examples/quickstart.ipynb runs top to bottom in a real Jupyter kernel (ipykernel, driven by
nbclient), offline: no cell raises, nothing is written to stderr (no dependency warnings), the
statistics render as an HTML table and the plots as images."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parent.parent / "examples" / "quickstart.ipynb"


def test_quickstart_notebook_runs_in_a_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    from jupyter_client.manager import KernelManager

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "2"))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    for cell in notebook.cells:  # run from a clean slate, whatever outputs the file holds
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    # A local-socket kernel, in this interpreter (jupyter_client maps "python" to sys.executable).
    kernel = KernelManager(kernel_name="python3", transport="ipc", connection_file=str(tmp_path / "kernel.json"))
    client = nbclient.NotebookClient(notebook, km=kernel, timeout=300, resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, with the cell and its traceback, if any cell fails

    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    stderr = [o.text for o in outputs if o.output_type == "stream" and o.name == "stderr"]
    assert not stderr, f"the notebook printed to stderr: {stderr}"
    html = [o.data["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert any(h.startswith("<table>") and "block efficiency" in h for h in html), "stats did not render as HTML"
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 2, "expected the acceptance-by-position plot and the rule comparison"
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "identical: True" in text
