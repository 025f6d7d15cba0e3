"""carpool's benchmarks: a harness and scenarios grouped by what they measure (README.md).

Importing any of them pins BLAS to one thread first, before numpy can load, so a model's
cost is the same offline and served.
"""

import os

# OPENBLAS_CORETYPE is left alone: the environment may set it on purpose.
for _var in (
    "OPENBLAS_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
):
    os.environ[_var] = "1"
