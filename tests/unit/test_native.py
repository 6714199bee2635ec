"""rtml._native: the build's stamp, which tells an edited source from the compiled one."""

from __future__ import annotations

from pathlib import Path

from rtml._native import STAMP, changed_since_build, stamp_text


def test_the_stamp_names_every_file_added_removed_or_edited_since_the_build(
        tmp_path: Path) -> None:
    for path in ("rtml/ids.py", "rtml/core/owner.py", "rtml/rpc/messages.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(f"# {path}\n")
    assert changed_since_build(tmp_path) == [f"rtml/{STAMP} (missing)"]
    (tmp_path / "rtml" / STAMP).write_text(stamp_text(tmp_path))
    assert changed_since_build(tmp_path) == []
    (tmp_path / "rtml/core/owner.py").write_text("# edited\n")
    (tmp_path / "rtml/ids.py").unlink()
    (tmp_path / "rtml/core/new.py").write_text("# added\n")
    assert changed_since_build(tmp_path) == [
        "rtml/core/new.py", "rtml/core/owner.py", "rtml/ids.py"]
