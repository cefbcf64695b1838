"""Servers under multi-turn agent load: ``python bench/serve.py [options]`` = ``lumotree bench serve [options]``.

See :mod:`lumotree.server.loadgen` for the workload (agent conversations at Poisson arrivals, each turn's prompt the
conversation so far plus a tool output) and what it reports (TTFT, TPOT, latency percentiles, goodput; autoregressive
against speculation).
"""

import sys

from lumotree.server.loadgen import main

if __name__ == "__main__":
    sys.exit(main())
