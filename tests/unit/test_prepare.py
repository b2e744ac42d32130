"""`orchestrator prepare` deletes and overwrites only what it wrote: a source name is one plain
path component, --out must be new, empty or prepare's own, and a failure leaves no folder it
created. Run in-process (no Ray) on the built-in corpus, a few documents per source."""

from __future__ import annotations

import pytest

from orchestrator.cli import main
from tests.conftest import TINY

SMALL = ["data.max_documents_per_source=20"]


def _tree(folder):
    return sorted((str(p.relative_to(folder)), p.read_bytes() if p.is_file() else None) for p in folder.rglob("*"))


@pytest.mark.parametrize("name", ["..", ".", ".hidden", "a/b", "..\\\\up"])
def test_a_source_name_that_is_not_a_plain_name_is_refused(name, tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    before = _tree(tmp_path)
    code = main(["prepare", str(TINY), *SMALL, f"data.sources.0.name='{name}'", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "data.sources.0.name" in err[0] and "plain name" in err[0], err
    assert _tree(tmp_path) == before  # nothing deleted, nothing created


def test_an_out_folder_holding_user_files_is_refused_untouched(tmp_path, capsys):
    out = tmp_path / "out"
    (out / "code").mkdir(parents=True)  # a user's folder that happens to share a source's name
    (out / "code" / "notes.txt").write_text("do not delete")
    before = _tree(tmp_path)
    assert main(["prepare", str(TINY), *SMALL, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out / 'code'} is not a shard folder prepare wrote" in err
    assert _tree(tmp_path) == before


def test_a_missing_source_creates_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    missing = f"data.sources=[{{name: mine, kind: files, path: '{tmp_path}/nope/*.txt'}}]"
    assert main(["prepare", str(TINY), *SMALL, missing, "--out", str(out)]) == 2
    assert "data.sources.0.path" in capsys.readouterr().err
    assert not out.exists()


def test_prepare_replaces_its_own_shards_and_nothing_else(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["prepare", str(TINY), *SMALL, "--out", str(out)]) == 0
    first = {p.name for p in out.iterdir()}
    assert first == {"code", "prose", "arithmetic"} and all((out / n / "meta.json").is_file() for n in first)
    # another config into the same folder: prepare's own shards are rebuilt, no refusal
    assert main(["prepare", str(TINY), "data.max_documents_per_source=10", "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == first
