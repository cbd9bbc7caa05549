"""Reading the user's dataset with `datasets` and their tokenizer (tests/helpers/seq2seq_data.py builds both
offline): exact lengths, the cache, --max-samples, and each bad input as one ConfigError naming the fix."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.seq2seq_data import expected_lengths, long_tail_lengths, save_tiny_t5, write_jsonl
from tuner.errors import ConfigError
from tuner.job import dataset as dataset_mod
from tuner.job.dataset import DataSource, read_lengths, tokenizer_for

SEQ2SEQ = {"input_column": "source", "target_column": "target"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    model = save_tiny_t5(root / "t5")
    data = write_jsonl(root / "data.jsonl", long_tail_lengths(300))
    return root, model, data


def read(path, tok, cache, **kw):
    return read_lengths(DataSource(str(path), **{**SEQ2SEQ, **kw}), str(tok), cache, progress=False)


def test_jsonl_lengths_are_the_tokenizers_counts_and_the_second_read_is_cached(files, tmp_path):
    _, model, data = files
    first = read(data, model, tmp_path)
    inputs, targets = expected_lengths(data)
    assert first.lengths.input.tolist() == inputs and first.lengths.target.tolist() == targets
    assert not first.cached and not first.sampled and first.total == 300
    assert max(inputs) > 300 > np.median(inputs)  # the fixture's long tail
    again = read(data, model, tmp_path)
    assert again.cached and again.lengths == first.lengths
    assert "300 samples of" in again.describe() and "[train], tokenized with" in again.describe()


def test_a_changed_file_is_read_again(files, tmp_path):
    _, model, _ = files
    data = write_jsonl(tmp_path / "d.jsonl", np.array([3, 4, 5]))
    assert read(data, model, tmp_path / "c").lengths.input.tolist() == [4, 5, 6]
    write_jsonl(data, np.array([3, 4, 5, 6]))
    fresh = read(data, model, tmp_path / "c")
    assert not fresh.cached and fresh.lengths.input.tolist() == [4, 5, 6, 7]


def test_saved_dataset_dict_splits_csv_and_causal_text(files, tmp_path):
    import datasets

    _, model, _ = files
    saved = tmp_path / "saved"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"source": ["w1 w2", "w3"], "target": ["w1", "w2 w3 w4"]}),
            "validation": datasets.Dataset.from_dict({"source": ["w1 w1 w1 w1"], "target": ["w2"]}),
        }
    ).save_to_disk(str(saved))
    assert read(saved, model, tmp_path).lengths.target.tolist() == [2, 4]
    val = read(saved, model, tmp_path, split="validation")
    assert val.lengths.input.tolist() == [5] and read(saved, model, tmp_path, split="validation").cached
    assert not any(p.name.startswith("cache-") for p in saved.rglob("*"))  # nothing written beside their data
    csv = tmp_path / "t.csv"
    csv.write_text("text,n\nw1 w2 w3,1\nw4,2\n")
    causal = read_lengths(DataSource(str(csv), text_column="text"), str(model), tmp_path, progress=False)
    assert causal.lengths.input.tolist() == [4, 2] and causal.lengths.target is None


def test_a_folder_of_split_files(files, tmp_path):
    _, model, _ = files
    folder = tmp_path / "folder"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", np.array([1, 2]))
    write_jsonl(folder / "validation.jsonl", np.array([9]))
    assert read(folder, model, tmp_path, split="validation").lengths.input.tolist() == [10]
    with pytest.raises(ConfigError, match="no split 'test'; give --split one of train, validation"):
        read(folder, model, tmp_path, split="test")


def test_max_samples_scans_a_seeded_random_sample_and_says_so(files, tmp_path, monkeypatch):
    _, model, data = files
    monkeypatch.setattr(dataset_mod, "MAX_SCAN", 100)
    with pytest.raises(ConfigError, match=r"has 300 samples, more than tuner scans whole \(100\); give --max-samples"):
        read(data, model, tmp_path)
    part = read(data, model, tmp_path, max_samples=50)
    assert len(part.lengths) == 50 and part.total == 300 and part.sampled
    assert part.describe().startswith("a seeded random 50 of 300 samples")
    inputs, _ = expected_lengths(data)
    assert set(part.lengths.input.tolist()) <= set(inputs)
    assert read(data, model, tmp_path, max_samples=50).lengths == part.lengths  # seeded: the same sample
    with pytest.raises(ConfigError, match="--max-samples 0 scans nothing"):
        read(data, model, tmp_path, max_samples=0)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"target_column": "label"}, r"has no column 'label'; its columns are source, target, id"),
        ({"split": "validation"}, r"has no split 'validation'; give --split one of train$"),
        ({"input_column": None, "target_column": None}, r"name its columns: --input-column and --target-column"),
        ({"text_column": "source"}, r"either --text-column .* not both"),
    ],
)
def test_bad_columns_and_splits_are_one_line(files, tmp_path, kw, match):
    _, model, data = files
    with pytest.raises(ConfigError, match=match) as err:
        read(data, model, tmp_path, **kw)
    assert "\n" not in str(err.value)


def test_empty_unreadable_and_unknown_datasets(files, tmp_path):
    _, model, _ = files
    import datasets

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ConfigError, match=r"empty.jsonl \[train\] has no samples; give a dataset that holds data"):
        read(empty, model, tmp_path)
    datasets.Dataset.from_dict({"source": [], "target": []}).save_to_disk(str(tmp_path / "none"))
    with pytest.raises(ConfigError, match=r"none \[train\] has no samples"):
        read(tmp_path / "none", model, tmp_path)
    one = datasets.Dataset.from_dict({"source": ["w1", "w2"], "target": ["w1", "w2"]}).filter(lambda r: False)
    one.save_to_disk(str(tmp_path / "filtered"))
    with pytest.raises(ConfigError, match=r"filtered \[train\] has no samples"):
        read(tmp_path / "filtered", model, tmp_path)
    with pytest.raises(ConfigError, match="not a local path, nor a hub dataset in the local cache"):
        read("nobody/no-such-dataset-h21", model, tmp_path)
    odd = tmp_path / "data.txt"
    odd.write_text("w1\n")
    with pytest.raises(ConfigError, match=r"is not \.jsonl, \.json, \.csv, \.parquet"):
        read(odd, model, tmp_path)


def test_tokenizers_load_offline_or_say_how(files, tmp_path):
    _, model, data = files
    with pytest.raises(ConfigError, match=r"tokenizer .* cannot be loaded offline .*; give --tokenizer a directory"):
        read(data, tmp_path / "no-tokenizer-here", tmp_path)
    assert tokenizer_for(None, str(model)) == str(model)  # the model's own
    assert tokenizer_for("t5-small", "builtin:flan-t5-large") == "t5-small"
    with pytest.raises(ConfigError, match="built-in preset with no tokenizer; give --tokenizer"):
        tokenizer_for(None, "builtin:flan-t5-large")
