"""Atomic output (`memllm_jax.files`): a file appears whole or not at all."""

import json

import pytest

from memllm_jax.files import atomic_open, atomic_write_json, atomic_write_text


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "out" / "result.json"
    atomic_write_json(path, {"a": 1}, indent=1)  # the directory is created
    assert json.loads(path.read_text()) == {"a": 1} and path.read_text().endswith("\n")
    with pytest.raises(RuntimeError):
        with atomic_open(path) as f:
            f.write('{"a": ')
            raise RuntimeError("killed half-way")
    assert json.loads(path.read_text()) == {"a": 1}
    assert sorted(p.name for p in path.parent.iterdir()) == ["result.json"]


def test_text_and_bytes_replace_the_target(tmp_path):
    path = tmp_path / "x.txt"
    atomic_write_text(path, "old")
    atomic_write_text(path, "néw")
    assert path.read_text(encoding="utf-8") == "néw"
    with atomic_open(tmp_path / "x.bin", "wb") as f:
        f.write(b"\x00\x01")
    assert (tmp_path / "x.bin").read_bytes() == b"\x00\x01" and (tmp_path / "x.bin").stat().st_mode & 0o777 == 0o644


def test_errors_name_the_target_not_the_temp_file(tmp_path, monkeypatch):
    import errno
    import os

    (tmp_path / "a_dir").mkdir()
    with pytest.raises(IsADirectoryError) as info:
        atomic_write_text(tmp_path / "a_dir", "x")
    assert info.value.filename == str(tmp_path / "a_dir")

    def failing_replace(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link", src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError) as info:
        atomic_write_text(tmp_path / "x.txt", "x")
    assert info.value.filename == str(tmp_path / "x.txt") and info.value.errno == errno.EXDEV
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_dir"]


def test_check_writable_refuses_before_any_work(tmp_path):
    from memllm_jax.files import check_writable

    check_writable(tmp_path / "new" / "deeper" / "out.json")  # folders that can be created: fine
    (tmp_path / "f").write_text("")
    with pytest.raises(NotADirectoryError) as info:
        check_writable(tmp_path / "f" / "out.json")
    assert info.value.filename == str(tmp_path / "f")
    with pytest.raises(NotADirectoryError):
        check_writable(tmp_path / "f", directory=True)
    with pytest.raises(IsADirectoryError):
        check_writable(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]
