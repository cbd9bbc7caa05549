"""The host checks a search runs before it writes a study or starts a probe: the world size against the GPUs this
process may use, the study's host record against this host's, and the NCCL preflight of a multi-rank search. Each
failure is a ConfigError with the one line the CLI prints."""

from __future__ import annotations

import tempfile
from pathlib import Path

from tuner.errors import ConfigError
from tuner.search.request import SearchRequest
from tuner.session.host_record import check_host_record
from tuner.settings import Settings
from tuner.storage import Store


def check_world_size(request: SearchRequest) -> None:
    """World size above the GPUs this process may use (CUDA_VISIBLE_DEVICES, MIG): a ConfigError before anything
    is written or probed."""
    from tuner.probing import gpus

    visible, physical, cuda_visible = gpus.host_visible_devices()
    gpus.check_world_size(request.world_size // request.nnodes, visible, physical, cuda_visible)  # ranks per node


def check_host(request: SearchRequest, store: Store, resumed: bool, settings: Settings) -> None:
    """Before the first probe: the study's host record (GPU and library versions, tuner.session.host_record) must
    match this host's; a study from before the record is compared by its first probe's GPU type instead (unless
    its device memory is fixed: a frontier learned on one device's limits must not rule another's); a multi-rank
    search on GPUs passes the NCCL preflight (all ranks, one all_reduce and a barrier, 90 s). ConfigError with one
    line if not."""
    from tuner.probing import gpus

    recorded = check_host_record(store, request.study_name, request.device_memory is not None, resumed)
    visible, physical, _ = gpus.host_visible_devices()
    if not (physical and visible):
        return
    if resumed and not recorded:
        first = next((row for row in store.probes(request.study_name, limit=5) if row.result), None)
        stored = (first.measurement.fingerprint or None) if first is not None else None
        here = gpus.gpu_name(gpus.first_visible_index(visible))
        refusal = gpus.fingerprint_refusal(stored, here, request.device_memory is not None)
        if refusal:
            raise ConfigError(refusal)
    ranks = request.world_size // request.nnodes  # each node's own: the preflight runs on this node
    if ranks > 1:
        from tuner.probing.environment import probe_env
        from tuner.probing.preflight import run_preflight

        with tempfile.TemporaryDirectory() as d:
            problem = run_preflight(ranks, probe_env(ranks, settings=settings), Path(d))
        if problem:
            raise ConfigError(problem)
