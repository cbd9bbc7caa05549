"""Integrations with training libraries: tuner.integrations.transformers (apply_best, TunerCallback)."""
