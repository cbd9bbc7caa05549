import json

import pytest

from tuner.errors import ModelSourceError
from tuner.job.model_source import resolve_model


def test_builtin_presets():
    assert resolve_model("builtin:tiny-t5").source == "builtin:tiny-t5"
    with pytest.raises(ModelSourceError) as err:
        resolve_model("builtin:nope")
    assert "builtin:tiny-t5" in str(err.value)


def test_local_dir_needs_config_json(tmp_path):
    with pytest.raises(ModelSourceError, match=r"config\.json"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
    assert resolve_model(str(tmp_path)).source == str(tmp_path.resolve())


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(ModelSourceError, match="does not exist"):
        resolve_model(str(tmp_path / "nope"))
    with pytest.raises(ModelSourceError, match="does not exist"):
        resolve_model("./no/such/model")


def test_hf_ids_pass_without_network():
    assert resolve_model("google/flan-t5-large").source == "google/flan-t5-large"
    assert resolve_model("t5-small").source == "t5-small"
    for bad in ("a/b/c", "has space", "bad:id"):
        with pytest.raises(ModelSourceError):
            resolve_model(bad)
