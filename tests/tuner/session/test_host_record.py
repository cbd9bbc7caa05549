"""A resumed study compares the hardware and library versions it was measured with (issue 13, point 11): a mismatch is
one line naming the field, both values and a new --study; the same host resumes; a study stored before the record
(probe rows, no record) resumes as before."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import threading

import pytest

from tuner.errors import ConfigError
from tuner.records import ProbeRow
from tuner.session.host_record import KEY, HostRecord, check_host_record, mismatch, this_host, torch_cuda
from tuner.storage import Store

HERE = HostRecord(
    gpu_name="NVIDIA H200",
    gpu_count=8,
    gpu_memory=150_754_820_096,
    torch="2.13.0",
    deepspeed="0.19.8",
    transformers="5.24.0",
    cuda="12.8",
)


def _store(url: str) -> Store:
    store = Store(url)
    store.ensure_study("s", {"model": "builtin:tiny-t5", "world_size": 1})
    return store


def _probe(store: Store) -> None:
    store.record_probe(
        ProbeRow.from_record(
            {"study_name": "s", "fidelity": "short", "config_key": "k", "knobs": {}, "config": {}, "status": "ok"}
            | {"result": {}, "peak_allocated": 1}  # a measured ok row has its result and its peak
        )
    )


@pytest.mark.parametrize(
    "field,value,words",
    [
        ("torch", "2.12.1", r"torch 2\.13\.0 but this host has 2\.12\.1"),
        ("deepspeed", "0.18.0", r"deepspeed 0\.19\.8 but this host has 0\.18\.0"),
        ("transformers", "absent", r"transformers 5\.24\.0 but this host has absent"),
        ("cuda", "", r"CUDA 12\.8 but this host has none"),
        ("gpu_name", "NVIDIA A100-SXM4-80GB", r"GPU NVIDIA H200 but this host has NVIDIA A100-SXM4-80GB"),
        ("gpu_memory", 85_899_345_920, r"GPU memory 140\.4 GiB but this host has 80\.0 GiB"),
    ],
)
def test_a_mismatch_is_one_line_naming_the_field_both_values_and_a_new_study(field, value, words) -> None:
    line = mismatch("s", HERE.to_dict(), dataclasses.replace(HERE, **{field: value}), device_memory_given=False)
    assert line is not None and "\n" not in line
    assert line.startswith("study 's' was measured with ") and "--study" in line
    assert re.search(words, line), line


def test_the_same_host_and_what_is_not_compared_pass() -> None:
    assert mismatch("s", HERE.to_dict(), HERE, False) is None
    assert mismatch("s", HERE.to_dict(), dataclasses.replace(HERE, gpu_count=4), False) is None  # world_size decides
    other_gpu = dataclasses.replace(HERE, gpu_name="NVIDIA A100-SXM4-80GB", gpu_memory=85_899_345_920)
    assert mismatch("s", HERE.to_dict(), other_gpu, device_memory_given=True) is None  # one budget on every worker
    assert "torch" in (mismatch("s", HERE.to_dict(), dataclasses.replace(other_gpu, torch="2.0"), True) or "")
    assert mismatch("s", {**HERE.to_dict(), "gpu_memory": None}, dataclasses.replace(HERE, gpu_memory=1), False) is None
    older = {k: v for k, v in HERE.to_dict().items() if k != "cuda"}  # a record without a field: not compared
    assert mismatch("s", older, dataclasses.replace(HERE, cuda="11.8"), False) is None


def test_a_new_study_records_its_host_and_resumes_on_the_same_one(storage_url: str) -> None:
    store = _store(storage_url)
    check_host_record(store, "s", False, resumed=False, here=HERE)
    assert store.require_study("s")[KEY] == HERE.to_dict()
    _probe(store)
    assert check_host_record(store, "s", False, resumed=True, here=HERE)  # the same host: resumes, compared
    with pytest.raises(ConfigError, match=r"measured with torch 2\.13\.0 but this host has 2\.14\.0.*--study"):
        check_host_record(store, "s", False, resumed=True, here=dataclasses.replace(HERE, torch="2.14.0"))
    assert store.require_study("s")[KEY] == HERE.to_dict()  # the refused host recorded nothing


def test_a_study_from_before_the_record_resumes_as_before(storage_url: str) -> None:
    store = _store(storage_url)
    _probe(store)
    assert not check_host_record(store, "s", False, resumed=True, here=dataclasses.replace(HERE, torch="0.1"))
    assert KEY not in store.require_study("s")  # no field, no comparison, nothing written


def test_a_defined_study_gets_the_record_of_its_first_worker(storage_url: str) -> None:
    store = _store(storage_url)  # as POST /studies leaves it: a definition, no probe row
    check_host_record(store, "s", False, resumed=True, here=HERE)
    assert store.require_study("s")[KEY] == HERE.to_dict()


def test_two_workers_recording_at_once_keep_one_record(storage_url: str) -> None:
    store = _store(storage_url)
    hosts = [dataclasses.replace(HERE, torch=f"2.{i}") for i in range(6)]
    kept: list[object] = []
    threads = [
        threading.Thread(target=lambda h=h: kept.append(store.record_in_definition("s", KEY, h.to_dict())))
        for h in hosts
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stored = store.require_study("s")[KEY]
    assert stored in [h.to_dict() for h in hosts] and kept == [stored] * len(hosts)
    assert store.require_study("s")["world_size"] == 1  # the rest of the definition is kept


def test_this_host_reads_the_installed_versions_without_importing_torch() -> None:
    from importlib import metadata

    import torch

    here = this_host()
    assert here.torch == metadata.version("torch") and here.deepspeed == metadata.version("deepspeed")
    assert torch_cuda() == (torch.version.cuda or "")
    code = "import sys; from tuner.session.host_record import this_host; this_host(); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "False"
