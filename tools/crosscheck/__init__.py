"""Differential checks of refimpl.hybrid against an installed vLLM (see `make crosscheck`)."""
