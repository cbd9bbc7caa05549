"""The HTTP service: reads tuner's storage and serves the best stable config. Never imports torch."""
