"""The restore corpus (benchmarks/restore_corpus.py): the values people hold in notebooks go
through `checkpoint.save` in one fresh process whose `__main__` plays the kernel, and
`checkpoint.recover` in another; each is restored exactly or skipped with its name and reason,
never silently wrong. Torch cases are skipped, with that reason, only where torch is absent."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import restore_corpus as corpus

pytestmark = pytest.mark.timeout(600)

SKIPPED = {
    "generator": "generator: cannot pickle 'generator' object",
    "open-file-for-writing": "open_for_writing: an open file (WRITTEN) is not saved; open it "
    "again after the restore",
    "open-file-for-reading": "open_for_reading: an open file (READ) is not saved; open it again "
    "after the restore",
    "open-file-in-a-dict": "files_in_a_dict: an open file (WRITTEN) is not saved; open it again "
    "after the restore",
    "socket": "sock: cannot pickle 'socket' object",
    "torch-non-leaf": "non_leaf: a tensor inside an autograd graph is not saved; save its "
    ".detach() or recompute it",
}
"""Cases skipped by design, with the reason the user reads."""
HAS_TORCH = importlib.util.find_spec("torch") is not None


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("corpus")
    found = corpus.run(directory)
    found["directory"] = directory
    return found


@pytest.mark.parametrize("case", corpus.CASES, ids=lambda case: case.name)
def test_each_value_is_restored_exactly_or_skipped_with_its_reason(
    outcome: dict[str, Any], case: corpus.Case
) -> None:
    verdict, detail = outcome["results"][case.name]
    if case.needs_torch and not HAS_TORCH:
        assert (verdict, detail) == ("skipped", "torch is not installed")
    elif case.name in SKIPPED:
        directory = outcome["directory"]
        reason = SKIPPED[case.name].replace("WRITTEN", str(directory / "written.txt"))
        assert (verdict, detail) == ("skipped", reason.replace("READ", str(directory / "read.txt")))
    else:
        assert (verdict, detail) == ("exact", "")


def test_the_corpus_has_no_wrong_value_and_the_save_committed(outcome: dict[str, Any]) -> None:
    verdicts = [verdict for verdict, _ in outcome["results"].values()]
    assert verdicts.count("wrong") == 0
    assert len(verdicts) == len(corpus.CASES) >= 30
    assert outcome["before"]["error"] == ""
    assert outcome["summary"].startswith("restored ")


def test_a_file_open_for_writing_is_left_as_it_was(outcome: dict[str, Any]) -> None:
    # dill reopens a pickled file handle in its mode: "w" truncated the user's file on restore
    assert outcome["written file kept"] is True
    assert (outcome["directory"] / "written.txt").read_text() == "written before the save\n"
