"""The demo's answer in README.md and docs/critical-batch.md is what the report prints today:
`orchestrator report DIR --out ...` (in this process) on the folder a demo wrote
(tests/data/demo_report: its tables and its report.json, whose recorded settings, the sweep's
target and criterion, the report reads back), compared with the block each doc marks. A change of
either side fails here."""

import contextlib
import gzip
import io
import re
import shutil

import pytest

from orchestrator import cli
from tests.conftest import ROOT

DEMO = ROOT / "tests" / "data" / "demo_report"
DOCS = [ROOT / "README.md", ROOT / "docs" / "critical-batch.md"]
MARK = "<!-- the demo's answer: tests/unit/test_docs_demo.py -->"


def squash(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def printed(tmp_path_factory):
    """What `report` prints for the demo's folder (its own answer: the sweep's target and criterion)."""
    folder = tmp_path_factory.mktemp("demo")
    for name in ("trials.csv", "report.json"):
        shutil.copy(DEMO / name, folder / name)
    with gzip.open(DEMO / "curves.csv.gz", "rb") as packed, open(folder / "curves.csv", "wb") as plain:
        shutil.copyfileobj(packed, plain)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["report", str(folder), "--out", str(folder.parent / "out")])
    assert code == 0, out.getvalue()[-2000:]
    return out.getvalue()


def answer_of(printed: str) -> str:
    """The answer paragraph and the line saying what to run (the per-batch table between them left out)."""
    lines = printed.splitlines()
    (paragraph,) = [ln for ln in lines if ln.startswith("Best configuration:")]
    (run,) = [ln for ln in lines if ln.startswith("What to run")]
    return f"{paragraph}\n{run}"


def block_of(doc) -> str:
    """The fenced block right after the doc's MARK."""
    text = doc.read_text()
    assert text.count(MARK) == 1, f"{doc.name} should mark the demo's answer once with {MARK}"
    found = re.search(re.escape(MARK) + r"\s*```\n(.*?)```", text, re.S)
    assert found, f"{doc.name}: no fenced block after {MARK}"
    return found[1]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_the_docs_show_the_answer_the_demo_prints(printed, doc):
    assert squash(block_of(doc)) == squash(answer_of(printed))


def test_the_folder_gives_the_sweeps_own_answer_back(printed):
    """report.json of the folder recorded the sweep's primary target (2.75, from the sweep file):
    read back, not the defaults (the final-loss criterion's own targets)."""
    assert "At loss 2.75 the critical batch size is B_crit = " in printed
    assert "Settings by default" not in printed
