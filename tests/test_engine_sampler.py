"""Sampler: greedy at temperature 0, seeded temperature sampling otherwise."""

from __future__ import annotations

import math

import torch

from refimpl.engine import Sampler


def test_temperature_zero_is_argmax_even_in_a_mixed_batch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=g)
    temperatures = torch.tensor([0.0, 1.0, 0.0, 0.7, 0.0, 2.0])
    tokens = Sampler(seed=0)(logits, temperatures)
    greedy_rows = temperatures == 0
    assert torch.equal(tokens[greedy_rows], logits.argmax(-1)[greedy_rows])
    assert torch.equal(Sampler(seed=5)(logits, torch.zeros(6)), logits.argmax(-1))


def test_same_seed_same_samples_other_seed_other_samples():
    logits = torch.zeros(64, 1000)  # uniform: every draw is pure chance
    temperatures = torch.ones(64)
    a = Sampler(seed=1)(logits, temperatures)
    b = Sampler(seed=1)(logits, temperatures)
    c = Sampler(seed=2)(logits, temperatures)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_frequencies_follow_softmax_of_logits_over_temperature():
    # logits ln(1), ln(2), ln(4): probabilities 1/7, 2/7, 4/7 at T=1; at T=2 the square roots.
    logits = torch.log(torch.tensor([[1.0, 2.0, 4.0]])).repeat(20_000, 1)
    for t, weights in ((1.0, [1, 2, 4]), (2.0, [1, math.sqrt(2), 2])):
        tokens = Sampler(seed=0)(logits, torch.full((20_000,), t))
        freq = torch.bincount(tokens, minlength=3).float() / 20_000
        want = torch.tensor(weights) / sum(weights)
        assert torch.allclose(freq, want, atol=0.015), (t, freq, want)
