"""tuner: finds the fastest training configuration that will not run out of memory."""

__version__ = "0.1.0"
