"""RL tests run tiny models: one torch thread is fastest, and far faster on a shared, busy CPU."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by the subprocesses some tests start

try:
    import torch
except ImportError:  # the adapter tests need no torch
    pass
else:
    torch.set_num_threads(1)
