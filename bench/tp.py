"""Tensor-parallel scaling benchmark: ``python bench/tp.py [options]`` = ``lumotree bench tp [options]``.

See :mod:`lumotree.optimized.parallel.bench` for what it measures (the autoregressive decode step against its floor
plus the step's collectives, and tokens/s of autoregressive and tree decoding at each batch size and tensor-parallel
size). Under ``torchrun --nproc-per-node N bench/tp.py ...`` each process is one rank.
"""

import sys

from lumotree.optimized.parallel.bench import main

if __name__ == "__main__":
    sys.exit(main())
