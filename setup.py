"""rtml's build: the package, with its hot path compiled to C by mypyc where it can be.

The list of compiled modules, and how an import picks them or their source, are in
``rtml/_native.py``. Without a C compiler the extensions are skipped (``optional``) and
the install is pure Python: the same behaviour, slower.
"""

import runpy
from pathlib import Path

from mypyc.build import mypycify
from setuptools import setup

native = runpy.run_path("rtml/_native.py")
extensions = mypycify(list(native["COMPILED"]), group_name=native["GROUP"])
for extension in extensions:
    extension.optional = True
Path("rtml", native["STAMP"]).write_text(native["stamp_text"](Path(".")))
setup(ext_modules=extensions)
