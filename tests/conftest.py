"""Shared test settings and fixtures: small, reproducible hypothesis runs, single-threaded
torch per worker, one tiny checkpoint per worker session, and the device a test's kernels run
on.

Where tests run: a test that calls a Triton kernel takes the `kernel_device` fixture and puts
its tensors there ("cpu" under Triton's interpreter, "cuda" where the kernels compile for a
GPU); every other test that builds tensors or an engine names its device itself. With
REFIMPL_FAKE_CUDA=1 (`tests/test_device_neutral.py` runs it) the tests run as if on a GPU
machine, to find a test that assumes the CPU on a machine that has none: torch reports a CUDA
device, the kernels still run in the interpreter, and the default device is "meta" (a device
that holds no data), so a tensor made without saying where it goes cannot be computed with,
just as on a GPU machine it would be a CPU tensor the compiled kernels refuse. Tests that take
no `kernel_device` run with the CPU as default device (as there), and may launch no Triton
kernel.

Literal restatements of upstream and workload strategies live in `nanovllm_oracle.py` (Part I)
and `hybrid_helpers.py` (Part II); test files import those, never each other.
"""

import os
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, settings

FAKE_CUDA = os.environ.get("REFIMPL_FAKE_CUDA") == "1"

# Two xdist workers share two cores: one torch thread each avoids oversubscription.
os.environ.setdefault("OMP_NUM_THREADS", "1")
try:
    import torch

    torch.set_num_threads(1)
    if FAKE_CUDA:  # before refimpl is imported: it reads both at import time
        os.environ["TRITON_INTERPRET"] = "1"  # the kernels still run, in the interpreter
        torch.cuda.is_available = lambda: True
        torch.set_default_device("meta")
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
# The REFIMPL_FAKE_CUDA run checks where tensors go, not values: a few examples per property
# suffice.
settings.register_profile("device-check", parent=settings.get_profile("ci"), max_examples=5)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny random Qwen3 checkpoint (config, safetensors, offline tokenizer), built once per
    worker."""
    from refimpl.engine import make_tiny_model

    with torch.device("cpu"):
        return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="session")
def kernel_device() -> str:
    """The device the Triton kernels take here: "cpu" (interpreter) or "cuda" (compiled); skips
    without Triton."""
    from refimpl.kernels.triton_setup import TRITON_DEVICE

    if TRITON_DEVICE is None:
        pytest.skip(
            "the Triton kernels cannot run in this process (Triton missing, or compiled mode "
            "without CUDA)"
        )
    return TRITON_DEVICE


_launches_allowed = [not FAKE_CUDA]


@pytest.fixture(autouse=True)
def _plan_for_the_oracles_cpu(monkeypatch):
    """vLLM's CPU platform plans by the host's instruction set, which `refimpl.models`
    detects when `cpu_isa` is "auto". The recorded vLLM oracles of the CPU platform were made
    on a CPU whose torch reported neither AVX512-BF16 nor AMX (bf16 Mamba states, 16-token
    MLA blocks), so every test plans for such a CPU unless it names one: `make test` gives the
    same answers on every host. Tests of the detection itself read a cpuinfo file."""
    from refimpl.models import cpu_platform

    monkeypatch.setattr(
        cpu_platform, "detect_cpu_isa", lambda cpuinfo=None: cpu_platform.CPU_ISAS["avx2"]
    )


@pytest.fixture(autouse=True)
def _default_device_as_on_a_gpu_machine(request):
    """Under REFIMPL_FAKE_CUDA: a test with `kernel_device` keeps the meta default device and
    may launch kernels; any other test runs with the CPU as default device (as on a GPU
    machine) and may not."""
    if not FAKE_CUDA:
        yield
        return
    states_device = "kernel_device" in request.fixturenames
    if not states_device:
        torch.set_default_device("cpu")
    _launches_allowed[0] = states_device
    try:
        yield
    finally:
        torch.set_default_device("meta")
        _launches_allowed[0] = False


if FAKE_CUDA:
    from triton.runtime.interpreter import InterpretedFunction

    _interpreted_run = InterpretedFunction.run

    def _guarded_run(self, *args, **kwargs):
        if not _launches_allowed[0]:
            raise AssertionError(
                "this test launches a Triton kernel but does not take the `kernel_device` "
                "fixture: on a GPU "
                "machine the kernels are compiled and refuse the CPU tensors it builds"
            )
        return _interpreted_run(self, *args, **kwargs)

    InterpretedFunction.run = _guarded_run


def pytest_collection_modifyitems(config, items):
    """Under REFIMPL_FAKE_CUDA: only the first and the last case of each parametrized test,
    and with REFIMPL_RERUN_PART="k/n" only every n-th of those from the k-th.

    That run checks where a test puts its tensors, which its code decides; its cases vary
    shapes, dtypes and values, which the ordinary run checks in full. The parts let several
    processes share it (`test_device_neutral.py`), each with a similar mix of slow and quick
    tests.
    """
    if not FAKE_CUDA:
        return
    cases = defaultdict(list)
    for item in items:
        cases[(item.nodeid.split("[")[0])].append(item)
    kept = {id(group[0]) for group in cases.values()} | {
        id(group[-1]) for group in cases.values()
    }
    if os.environ.get("REFIMPL_RERUN_PART"):
        part, parts = map(int, os.environ["REFIMPL_RERUN_PART"].split("/"))
        in_part = [item for item in items if id(item) in kept][part::parts]
        kept = {id(item) for item in in_part}
    deselected = [item for item in items if id(item) not in kept]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if id(item) in kept]
