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
compile_args += ["-fopenmp", "-fno-math-errno"]
if native:
    compile_args.append("-march=native")
directives = {"language_level": 3, "boundscheck": debug, "wraparound": debug,
              "initializedcheck": debug, "cdivision": True}

extensions = [
    Extension(
        f"worker._{name}",
        [f"cyext/{name}.pyx"],
        include_dirs=["cyext"],
        extra_compile_args=compile_args,
        extra_link_args=["-fopenmp"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
    for name in sorted(p.stem for p in Path("cyext").glob("*.pyx"))
]



class ParallelBuildExt(build_ext):
    """Compiles the extensions side by side, one a core (the kernels take minutes each)."""

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1


setup(ext_modules=cythonize(extensions, include_path=["cyext"], compiler_directives=directives,
                            nthreads=os.cpu_count() or 1),
      cmdclass={"build_ext": ParallelBuildExt})
