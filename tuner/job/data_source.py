"""Where the user's data is and which of its columns are text: one record, read by tuner.job.dataset (the cache
and the lengths) and tuner.job.dataset_io (`datasets`). Pure."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import ConfigError


@dataclass(frozen=True)
class DataSource:
    path: str  # save_to_disk folder, data file or folder, or a cached hub dataset name
    split: str = "train"
    input_column: str | None = None  # seq2seq inputs
    target_column: str | None = None  # seq2seq labels
    text_column: str | None = None  # causal LM text
    max_samples: int | None = None  # scan a seeded random sample of this many
    seed: int = 0

    def columns(self) -> tuple[str, str | None]:
        """(input column, target column or None for a causal LM)."""
        if self.text_column is not None:
            if self.input_column is not None or self.target_column is not None:
                raise ConfigError(
                    "give either --text-column (causal LM) or --input-column with --target-column (seq2seq), not both"
                )
            return self.text_column, None
        if self.input_column is not None and self.target_column is not None:
            return self.input_column, self.target_column
        raise ConfigError(
            f"dataset {self.path}: name its columns: --input-column and --target-column (seq2seq) or --text-column "
            "(causal LM)"
        )

    def with_split(self, split: str) -> DataSource:
        return DataSource(
            self.path, split, self.input_column, self.target_column, self.text_column, self.max_samples, self.seed
        )
