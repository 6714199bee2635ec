"""rtml's build: the package, with its hot path compiled to C by mypyc where it can be.

The list of compiled modules, and how an import picks them or their source, are in
``rtml/_native.py``. Without a C compiler (or if mypyc cannot run) the extensions are
skipped and the install is pure Python: the same behaviour, slower. The stamp that lets
an import trust the compiled modules is written only once every one of them is built.
"""

import runpy
import warnings
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

native = runpy.run_path("rtml/_native.py")


class BuildAndStamp(build_ext):
    def run(self) -> None:
        # In place, setuptools builds into build_lib, then copies what is there to the tree.
        outputs = [Path(self.build_lib)] + ([Path(".")] if self.inplace else [])
        names = [self.get_ext_filename(ext.name) for ext in self.extensions]
        stamp = outputs[-1] / "rtml" / native["STAMP"]
        stamp.unlink(missing_ok=True)
        for base in outputs:  # an extension that fails now must not leave an older one
            for name in names:
                (base / name).unlink(missing_ok=True)
        super().run()
        if names and all((outputs[-1] / name).exists() for name in names):
            stamp.parent.mkdir(parents=True, exist_ok=True)
            stamp.write_text(native["stamp_text"](Path(".")))


def compiled_extensions() -> list:
    try:
        from mypyc.build import mypycify

        extensions = mypycify(list(native["COMPILED"]), group_name=native["GROUP"])
    except (Exception, SystemExit) as exc:  # mypyc reports type errors with SystemExit
        warnings.warn(f"rtml: mypyc could not compile the hot path ({exc}); installing "
                      "pure Python", stacklevel=1)
        return []
    for extension in extensions:
        extension.optional = True
    return extensions


setup(ext_modules=compiled_extensions(), cmdclass={"build_ext": BuildAndStamp})
