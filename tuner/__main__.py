"""``python3 -m tuner ...``: the ``tuner`` command without an installed entry point (a bare machine, a wheel kit)."""

from tuner.cli.app import main

main()
