"""kvcore's build: pure Python; with ``KVCORE_MYPYC=1`` also the simulator's hot modules compiled
by mypyc (:mod:`kvcore.simulation.compiled` names them and says why).

Everything else about the package is in ``pyproject.toml``. The compiled build needs a C
compiler, Python's headers and mypy (``kvcore[dev]``) in the building environment::

    KVCORE_MYPYC=1 python setup.py build_ext --inplace           # a checkout
    KVCORE_MYPYC=1 pip wheel --no-build-isolation --no-deps .   # a wheel
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
# compiled.py imports nothing of kvcore: read it before kvcore is installed
COMPILED = runpy.run_path(str(ROOT / "kvcore" / "simulation" / "compiled.py"))


class RecordedBuildExt(build_ext):
    """build_ext, then the record of the sources the extensions were built from (beside them:
    in the checkout with ``--inplace``, else in the wheel), which the stale check at import
    compares (``kvcore.simulation.compiled.check_compiled_sources``)."""

    def run(self) -> None:
        super().run()
        if not self.extensions:
            return
        digests = {path: COMPILED["source_digest"](ROOT / path) for path in COMPILED["COMPILED_MODULES"]}
        record = (ROOT if self.inplace else Path(self.build_lib)) / COMPILED["DIGESTS_FILE"]
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")


def compiled_extensions() -> list:
    """mypyc's extension modules of the compiled build, or none (the pure-Python build)."""
    if os.environ.get("KVCORE_MYPYC", "0").strip() in ("", "0"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        sys.exit(
            "KVCORE_MYPYC=1 builds kvcore's simulator with mypyc, which is not installed here: "
            "pip install 'mypy>=1.8' (or kvcore[dev]) into the building environment and build "
            "without isolation (pip wheel --no-build-isolation), or unset KVCORE_MYPYC for the "
            "pure-Python build"
        )
    # mypyc's shared runtime inside the package (kvcore/simulation/mypyc_runtime__mypyc*): at the
    # top level, an editable install run from another directory would not find it
    modules = list(COMPILED["COMPILED_MODULES"])
    return mypycify(modules, opt_level="3", group_name="kvcore.simulation.mypyc_runtime")


setup(ext_modules=compiled_extensions(), cmdclass={"build_ext": RecordedBuildExt})
