"""Faithful, deterministic models of inference engines' prefix caches. Pure: no I/O."""
