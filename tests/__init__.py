"""The test suite. `make test` runs it in two pytest-xdist workers on CI's 2 cores, so each test process gets one
thread of torch's, as torchrun gives each rank: with torch's default, one thread per core, the OpenMP threads of one
worker's fit spin-wait against the other worker (a 2-epoch MNIST fit beside a busy core: 147 s with two threads,
23 s with one; alone: 17 s and 22 s). Set here, before anything imports torch; the processes tests start inherit it.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
