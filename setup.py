"""Builds the Cython kernels in cyext/ as extension modules of the `worker` package.

Environment switches:
  SCORING_WORKER_NATIVE=1  compile with -march=native (compare a build with and without it:
                           bench/ab.py)
  SCORING_WORKER_DEBUG=1   Cython bounds and wraparound checks on, -O0 -g
"""

import os
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

debug = os.environ.get("SCORING_WORKER_DEBUG") == "1"
native = os.environ.get("SCORING_WORKER_NATIVE") == "1"
compile_args = ["-O0", "-g"] if debug else ["-O3"]
# -fstack-clash-protection: a frame larger than a page is touched page by page, so a thread
# whose stack is too small for a kernel's buffers faults at its guard page, never past it
compile_args += ["-fopenmp", "-fno-math-errno", "-fstack-clash-protection"]
if native:
    compile_args.append("-march=native")
directives = {"language_level": 3, "boundscheck": debug, "wraparound": debug,
              "initializedcheck": debug, "cdivision": True}



def simdjson_dir() -> str:
    """The amalgamated simdjson (simdjson.h, simdjson.cpp) that the pysimdjson package ships
    (a build requirement): compiled into worker._eventread, not copied into this repository."""
    import importlib.util

    spec = importlib.util.find_spec("simdjson")
    where = Path(spec.origin).parent if spec and spec.origin else None
    if where is None or not (where / "simdjson.cpp").exists():
        raise SystemExit("building worker._eventread needs simdjson's sources from the "
                         "pysimdjson package: pip install 'pysimdjson>=7,<8'")
    return str(where)


def extension(name: str) -> Extension:
    import numpy

    if name == "eventread":  # C++: simdjson's DOM parser (cyext/json_rows.h)
        src = simdjson_dir()
        return Extension(
            f"worker._{name}", [f"cyext/{name}.pyx", "cyext/simdjson_unit.cpp"],
            include_dirs=["cyext", src], language="c++",
            extra_compile_args=(["-O0", "-g"] if debug else ["-O2"]) + ["-std=c++17"],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")])
    return Extension(
        f"worker._{name}",
        [f"cyext/{name}.pyx"],
        include_dirs=["cyext", numpy.get_include()],  # (numpy's C API: _monitor's few rows)
        extra_compile_args=compile_args,
        extra_link_args=["-fopenmp"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )


extensions = [extension(name) for name in sorted(p.stem for p in Path("cyext").glob("*.pyx"))]



class ParallelBuildExt(build_ext):
    """Compiles the extensions side by side, one a core (the kernels take minutes each)."""

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1


setup(ext_modules=cythonize(extensions, include_path=["cyext"], compiler_directives=directives,
                            nthreads=os.cpu_count() or 1),
      cmdclass={"build_ext": ParallelBuildExt})
