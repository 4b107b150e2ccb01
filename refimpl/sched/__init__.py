"""vLLM v1's scheduler, default path, on `refimpl.hybrid`'s KV cache manager (vLLM's
`vllm/v1/core/sched/` file map: `scheduler`, `async_scheduler`, `output`, `request_queue`)."""

from refimpl.sched.async_scheduler import AsyncScheduler
from refimpl.sched.config import SchedulerConfig
from refimpl.sched.output import (
    CachedRequestData,
    EngineCoreOutput,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from refimpl.sched.request import Request, RequestStatus
from refimpl.sched.request_queue import (
    FCFSRequestQueue,
    PriorityRequestQueue,
    SchedulingPolicy,
    create_request_queue,
)
from refimpl.sched.scheduler import Scheduler


def make_scheduler(scheduler_config: SchedulerConfig, kv_cache_config, **kwargs) -> Scheduler:
    """`AsyncScheduler` when `scheduler_config.async_scheduling`, else `Scheduler` (as
    vLLM's engine core picks the class)."""
    cls = AsyncScheduler if scheduler_config.async_scheduling else Scheduler
    return cls(scheduler_config, kv_cache_config, **kwargs)


__all__ = [
    "AsyncScheduler",
    "CachedRequestData",
    "EngineCoreOutput",
    "FCFSRequestQueue",
    "ModelRunnerOutput",
    "NewRequestData",
    "PriorityRequestQueue",
    "Request",
    "RequestStatus",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "SchedulingPolicy",
    "create_request_queue",
    "make_scheduler",
]
