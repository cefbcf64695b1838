"""End-to-end decoding benchmark of the engine: ``python bench/e2e.py [options]`` = ``lumotree bench e2e [options]``.

See :mod:`lumotree.optimized.engine.e2e` for what it measures (model, batch sizes, autoregressive vs chain vs tree at
equal
drafter, synthetic acceptance 0.6 / 0.8 / 0.9 and the real small draft model, predicted vs measured throughput).
With ``--model DIR --workload NAME``: a checkpoint's real-text workloads with the real drafters
(:mod:`lumotree.optimized.engine.e2e_real`); with ``--replay PROFILE.json --random PRESET``: recorded acceptance
replayed on a random model (:mod:`lumotree.optimized.engine.replay`).
"""

import sys

from lumotree.optimized.engine.e2e import main

if __name__ == "__main__":
    sys.exit(main())
