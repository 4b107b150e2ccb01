"""Pick each sequence's next token from its logits.

Temperature 0 is greedy (argmax, deterministic). A positive temperature T samples from
softmax(logits / T) with the engine's own seeded `torch.Generator`, so a run with the same
seed, prompts and settings samples the same tokens without touching torch's global random
state.
"""

from __future__ import annotations

import torch


class Sampler:
    def __init__(self, seed: int = 0, device: torch.device | str = "cpu") -> None:
        self.generator = torch.Generator(device=device).manual_seed(seed)

    @torch.no_grad()
    def __call__(self, logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
        """logits `[batch, vocab]`, temperatures `[batch]` (0 = greedy) -> token ids
        `[batch]`."""
        logits = logits.float()
        greedy = logits.argmax(dim=-1)
        sampling = temperatures > 0
        if not bool(sampling.any()):
            return greedy
        safe_t = torch.where(sampling, temperatures, torch.ones_like(temperatures))
        probs = torch.softmax(logits / safe_t[:, None], dim=-1)
        sampled = torch.multinomial(probs, num_samples=1, generator=self.generator).squeeze(1)
        return torch.where(sampling, sampled, greedy)
