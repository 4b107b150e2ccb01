"""Shared test settings and fixtures: small, reproducible hypothesis runs, single-threaded torch
per worker, and one tiny checkpoint per worker session.

Literal restatements of upstream and workload strategies live in `nanovllm_oracle.py` (Part I)
and `hybrid_helpers.py` (Part II); test files import those, never each other.
"""

import os

import pytest
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


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny random Qwen3 checkpoint (config, safetensors, offline tokenizer), built once per worker."""
    from refimpl.engine import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)
