"""End-to-end decoding benchmark of the engine: ``python bench/e2e.py [options]`` = ``lumotree bench e2e [options]``.

See :mod:`lumotree.optimized.engine.e2e` for what it measures (model, batch sizes, autoregressive vs chain vs tree at
equal
drafter, synthetic acceptance 0.6 / 0.8 / 0.9 and the real small draft model, predicted vs measured throughput).
"""

import sys

from lumotree.optimized.engine.e2e import main

if __name__ == "__main__":
    sys.exit(main())
