"""Shared memory private to the cluster's user (issue 17, item 1): another local user can
neither read a node's objects nor plant one for the cluster to unpickle, at the names it
would use next or anywhere else it might read from.

The attacker runs as uid 65534 (nobody), under the system Python (the virtualenv's lives
under /root, which nobody cannot enter); that needs root, so those tests are skipped
elsewhere."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import rtml
from rtml import objectstore
from rtml.core import current
from rtml.exceptions import ObjectLostError, RtmlSystemError
from rtml.ids import TaskID, object_id_for

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
as_another_user = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON),
    reason="needs root (to run the attacker as uid 65534) and /usr/bin/python3")


class Payload:
    """Unpickling this runs ``touch MARKER``: what a planted object would do."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def _as_nobody(script: str, **inputs: object) -> dict[str, str]:
    """Run ``script`` as uid 65534; it reads ``inputs`` and prints a JSON result."""
    done = subprocess.run([SYSTEM_PYTHON, "-c", script, json.dumps(inputs)], user=NOBODY,
                          group=NOBODY, capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    result: dict[str, str] = json.loads(done.stdout)
    return result


ATTACK = r"""
import json, os, sys
inputs = json.loads(sys.argv[1])
store, payload, result = inputs["store"], bytes.fromhex(inputs["payload"]), {}
result["sees"] = "yes" if os.path.basename(store) in os.listdir("/dev/shm") else "no"
for what, act in [("list", lambda: os.listdir(store)),
                  ("read", lambda: open(os.path.join(store, inputs["existing"]), "rb")),
                  ("stat", lambda: os.stat(os.path.join(store, inputs["existing"])))]:
    try:
        act()
        result[what] = "done"
    except OSError as exc:
        result[what] = type(exc).__name__
for name in inputs["next"]:
    for path in (os.path.join(store, name), os.path.join(store, name + ".1-1.tmp")):
        try:
            with open(path, "wb") as f:
                f.write(payload)
            result["plant"] = "done"
        except OSError as exc:
            result.setdefault("plant", type(exc).__name__)
    # the names of the old flat layout, beside the store
    flat = "/dev/shm/rtml-" + os.path.basename(store)[5:17] + "-" + name
    with open(flat, "wb") as f:
        f.write(payload)
print(json.dumps(result))
"""


@as_another_user
def test_another_user_can_neither_read_nor_plant_objects(cluster: None,
                                                         tmp_path: Path) -> None:
    rt = current.require_runtime()
    store = rt.store_dir
    st = os.lstat(store)
    assert (st.st_uid, st.st_mode & 0o777) == (os.geteuid(), 0o700)
    assert os.path.basename(store) == "rtml-" + rt.node_id.hex()  # 96 random bits in it
    first = rtml.put(np.arange(1 << 17))  # 1 MiB: in shared memory
    # The attacker knows how put ids are made (a prefix and a counter): the next ones.
    prefix, counter = first.id[:8], int.from_bytes(first.id[8:16], "big")
    upcoming = [object_id_for(TaskID(prefix + (counter + k).to_bytes(8, "big")), 0).hex()
                for k in range(1, 6)]
    marker = tmp_path / "pwned"
    tmp_path.chmod(0o777)  # (so that a payload run as either user could leave its mark)
    flat = [f"/dev/shm/rtml-{rt.node_id.hex()[:12]}-{name}" for name in upcoming]
    try:
        result = _as_nobody(ATTACK, store=store, existing=first.id.hex(), next=upcoming,
                            payload=pickle.dumps(Payload(str(marker))).hex())
        assert result == {"sees": "yes", "list": "PermissionError",
                          "read": "PermissionError", "stat": "PermissionError",
                          "plant": "PermissionError"}
        values = [np.full(1 << 17, k) for k in range(1, 6)]
        refs = [rtml.put(value) for value in values]
        assert [ref.id.hex() for ref in refs] == upcoming  # the attacker's guess was right
        for ref, value in zip(refs, values, strict=True):
            assert np.array_equal(rtml.get(ref, timeout=30), value)
        assert np.array_equal(rtml.get(first, timeout=30), np.arange(1 << 17))
        assert not marker.exists()
    finally:
        for path in flat:
            Path(path).unlink(missing_ok=True)


def test_a_client_refuses_a_store_directory_that_is_not_private(tmp_path: Path) -> None:
    private = tmp_path / "store"
    private.mkdir(mode=0o700)
    assert objectstore.check_store_dir(str(private)) == str(private)
    link = tmp_path / "link"
    link.symlink_to(private)
    with pytest.raises(RtmlSystemError, match="not a directory"):
        objectstore.check_store_dir(str(link))
    private.chmod(0o755)
    with pytest.raises(RtmlSystemError, match="mode 755 lets others in"):
        objectstore.check_store_dir(str(private))
    with pytest.raises(RtmlSystemError, match="cannot be read"):
        objectstore.check_store_dir(str(tmp_path / "absent"))


@as_another_user
def test_a_store_directory_someone_else_made_is_refused_and_left_alone() -> None:
    name = os.urandom(16).hex()
    path = objectstore.store_dir_of(name)
    _as_nobody("import os, sys, json; p = json.loads(sys.argv[1])['path']; os.mkdir(p, 0o777);"
               " open(p + '/theirs', 'w').close(); print('{}')", path=path)
    try:
        assert os.lstat(path).st_uid == NOBODY
        with pytest.raises(RtmlSystemError, match="exists already, made by someone else"):
            objectstore.create_store_dir(name)
        with pytest.raises(RtmlSystemError, match="owned by uid 65534"):
            objectstore.check_store_dir(path)
        objectstore.remove_store_dir(path)  # not ours: nothing is removed
        assert os.listdir(path) == ["theirs"]
        assert Path(path) not in objectstore.store_dirs()
    finally:
        shutil.rmtree(path)


def test_an_object_file_that_is_not_private_is_not_read(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    store = objectstore.create_store_dir(os.urandom(16).hex())
    try:
        planted = objectstore.segment_path(store, os.urandom(20))
        objectstore.write_segment(planted, pickle.dumps(Payload(str(marker)), protocol=5), [])
        assert objectstore.existing_size(planted) > 0
        spill = tmp_path / "spilled"
        os.chmod(planted, 0o644)
        for read in (objectstore.read_segment, objectstore.existing_size,
                     lambda path: objectstore.copy_file(path, str(spill))):
            with pytest.raises(ObjectLostError, match="mode 644 lets others in"):
                read(planted)
        if os.geteuid() == 0:
            os.chmod(planted, 0o600)
            os.chown(planted, NOBODY, NOBODY)
            with pytest.raises(ObjectLostError, match="owned by uid 65534"):
                objectstore.read_segment(planted)
        link = objectstore.segment_path(store, os.urandom(20))
        os.symlink(planted, link)
        with pytest.raises(OSError):  # ELOOP: a symlink is never followed
            objectstore.read_segment(link)
        assert not marker.exists() and not spill.exists()
    finally:
        objectstore.remove_store_dir(store)
