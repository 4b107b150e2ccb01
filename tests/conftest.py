"""Shared test settings: small, reproducible hypothesis runs and single-threaded torch per worker."""

import os

from hypothesis import HealthCheck, settings

# Two xdist workers share two cores: one torch thread each avoids oversubscription.
os.environ.setdefault("OMP_NUM_THREADS", "1")
try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover - torch is a hard dependency, but keep collection alive
    pass

settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=300, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
