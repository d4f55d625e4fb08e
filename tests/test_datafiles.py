"""harness/data/files.py: checksums against SHA256SUMS, strict JSON and JSONL, atomic writes; the shipped data
verifies."""

import hashlib
import json
import os
from pathlib import Path

import pytest

from harness.config.paths import REPO_ROOT
from harness.data.files import (
    DataFileError,
    read_json,
    read_jsonl,
    sha256_file,
    verify_checksum,
    write_json_atomic,
    write_jsonl_atomic,
    write_sha256sums,
    write_text_atomic,
)

DATA = REPO_ROOT / "data"


def _sums(folder: Path, files: dict[str, bytes]) -> None:
    lines = []
    for rel, content in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        lines.append(f"{hashlib.sha256(content).hexdigest()}  {rel}\n")
    (folder / "SHA256SUMS").write_text("".join(lines))


def test_every_shipped_data_file_is_listed_and_verifies():
    listed = {line.split(maxsplit=1)[1].strip() for line in (DATA / "SHA256SUMS").read_text().splitlines() if line}
    on_disk = {p.relative_to(DATA).as_posix() for p in DATA.rglob("*.jsonl")}
    assert listed == on_disk
    for rel in sorted(listed):
        assert verify_checksum(DATA / rel) == sha256_file(DATA / rel)


def test_shipped_benchmarks_have_the_documented_row_counts():
    counts = {"math500": 500, "gsm8k": 1319, "aime24": 30, "aime25": 30, "amc23": 40, "minerva_math": 272,
              "olympiadbench": 675}
    for name, n in counts.items():
        rows = read_jsonl(DATA / "benchmarks" / f"{name}.jsonl")
        assert len(rows) == n
        assert {r["source"] for r in rows} == {name}


def test_nearest_sums_file_in_an_ancestor_is_used(tmp_path):
    _sums(tmp_path, {"sub/dir/a.jsonl": b'{"id": 1}\n'})
    assert verify_checksum(tmp_path / "sub/dir/a.jsonl") == hashlib.sha256(b'{"id": 1}\n').hexdigest()


def test_mismatch_names_file_expected_and_actual(tmp_path):
    _sums(tmp_path, {"a.jsonl": b"original\n"})
    (tmp_path / "a.jsonl").write_bytes(b"tampered\n")
    with pytest.raises(DataFileError) as err:
        verify_checksum(tmp_path / "a.jsonl")
    message = str(err.value)
    assert "a.jsonl" in message and "mismatch" in message
    assert hashlib.sha256(b"original\n").hexdigest() in message
    assert hashlib.sha256(b"tampered\n").hexdigest() in message


def test_unlisted_and_missing_files_are_refused(tmp_path):
    _sums(tmp_path, {"a.jsonl": b"x\n"})
    (tmp_path / "b.jsonl").write_text("y\n")
    with pytest.raises(DataFileError, match=r"b\.jsonl: not listed"):
        verify_checksum(tmp_path / "b.jsonl")
    with pytest.raises(DataFileError, match="not found"):
        verify_checksum(tmp_path / "c.jsonl")


def test_a_closer_sums_file_that_does_not_list_the_file_falls_through_to_an_ancestor(tmp_path):
    _sums(tmp_path, {"sub/a.jsonl": b"x\n"})
    (tmp_path / "sub" / "SHA256SUMS").write_text(f"{'0' * 64}  other.jsonl\n")
    assert verify_checksum(tmp_path / "sub" / "a.jsonl")


def test_malformed_sums_line_names_file_and_line(tmp_path):
    (tmp_path / "a.jsonl").write_text("x\n")
    (tmp_path / "SHA256SUMS").write_text("not-a-digest  a.jsonl\n")
    with pytest.raises(DataFileError, match=r"SHA256SUMS:1"):
        verify_checksum(tmp_path / "a.jsonl")


@pytest.mark.parametrize("line, problem", [
    ('{"id": "a", "problem": "1+1", "answer": "2"', "malformed JSON"),
    ('["id", "problem"]', "expected a JSON object"),
    ('{"id": "a", "problem": "1+1"}', "'answer' is missing"),
    ('{"id": "a", "problem": "  ", "answer": "2"}', "'problem' is empty"),
])
def test_bad_jsonl_rows_name_file_and_line(tmp_path, line, problem):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": "ok", "problem": "1+1", "answer": "2"}\n\n' + line + "\n")
    with pytest.raises(DataFileError) as err:
        read_jsonl(path)
    assert f"{path}:3" in str(err.value) and problem in str(err.value)


def test_read_jsonl_custom_required_and_unicode(tmp_path):
    path = tmp_path / "rows.jsonl"
    write_jsonl_atomic(path, [{"id": "é", "x": 1}, {"id": "b", "x": 0}])
    assert read_jsonl(path, required=("id",)) == [{"id": "é", "x": 1}, {"id": "b", "x": 0}]
    assert "é" in path.read_text(encoding="utf-8")  # ensure_ascii=False, like the shipped data


def test_atomic_writers_replace_whole_files_and_leave_no_temp(tmp_path):
    target = tmp_path / "out" / "results.json"
    write_json_atomic(target, {"a": 1})
    write_json_atomic(target, {"a": 2})
    assert json.loads(target.read_text()) == {"a": 2}
    assert sorted(os.listdir(target.parent)) == ["results.json"]
    assert oct(target.stat().st_mode & 0o777) == "0o644"


def test_write_text_atomic_replaces_the_file_byte_for_byte(tmp_path):
    target = tmp_path / "report" / "leaderboard.md"
    write_text_atomic(target, "old\n")
    assert write_text_atomic(target, "| Δ |\n\nend") == target
    assert target.read_bytes() == "| Δ |\n\nend".encode()
    assert sorted(os.listdir(target.parent)) == ["leaderboard.md"]
    assert oct(target.stat().st_mode & 0o777) == "0o644"


def test_read_json_names_the_file_and_line_of_malformed_json(tmp_path):
    good = write_json_atomic(tmp_path / "run.json", {"budget": {"amount": 4.0}})
    assert read_json(good) == {"budget": {"amount": 4.0}}
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "k": 4,\n}\n')
    with pytest.raises(DataFileError, match=r"bad\.json:3: malformed JSON"):
        read_json(bad)


def test_failed_write_keeps_the_old_file_and_removes_the_temp(tmp_path):
    target = tmp_path / "samples.jsonl"
    write_jsonl_atomic(target, [{"a": 1}])

    def rows():
        yield {"a": 2}
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        write_jsonl_atomic(target, rows())
    assert read_jsonl(target, required=()) == [{"a": 1}]
    assert os.listdir(tmp_path) == ["samples.jsonl"]


def test_write_sha256sums_for_generated_data(tmp_path):
    write_jsonl_atomic(tmp_path / "eval.jsonl", [{"id": "a", "problem": "1+1", "answer": "2"}])
    write_jsonl_atomic(tmp_path / "sub" / "ood.jsonl", [{"id": "b", "problem": "1+2", "answer": "3"}])
    write_sha256sums(tmp_path, [tmp_path / "eval.jsonl"])
    write_sha256sums(tmp_path, [tmp_path / "sub" / "ood.jsonl"])  # adds, keeps the earlier line
    assert verify_checksum(tmp_path / "eval.jsonl") and verify_checksum(tmp_path / "sub" / "ood.jsonl")
    lines = (tmp_path / "SHA256SUMS").read_text().splitlines()
    assert [line.split("  ")[1] for line in lines] == ["eval.jsonl", "sub/ood.jsonl"]
    with pytest.raises(DataFileError, match="not inside"):
        write_sha256sums(tmp_path / "sub", [tmp_path / "eval.jsonl"])
