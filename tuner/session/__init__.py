"""The search's edge: everything a search does to the world, around the pure decisions of tuner.search.

- ``session``: one search for every face (``tuner.tune``, `tuner search`), its steps in one order, the probe launcher,
  the events, the clock and the settings injected here;
- ``options``: the declared settings of a search (SearchOptions) and their parsing into a request (files, sizes,
  durations), with the ``Face`` each front door reads them through (``POST /studies`` too);
- ``checks``: the host checks (world size, the host record, the NCCL preflight); ``host_record`` the record itself;
- ``memory``: the memory estimate a search starts with (a trace, or a recorded one for the benchmarks);
- ``driver``: runs the strategy's proposals as probes on the database; ``recovery``: what gone workers left;
- ``plan``: the dry run; ``best``: a study's best stable config, for the CLI, the Python API and the HTTP API.

Submodules are imported by name: importing this package loads none of them (``import tuner`` stays light).
"""
