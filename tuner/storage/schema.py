"""The project's own tables, next to Optuna's RDB tables in the same database.

Optuna's tables stay the source of truth for trial state (so optuna-dashboard and the optuna CLI read our storage
unchanged); these hold what Optuna has no place for: study definitions, search runs, every probe's measurements, and
the claims that keep several workers from probing one config twice.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from tuner.storage.utc import UTCDateTime

# These tables are what the code reads and writes; the database gets them through the alembic revisions in
# tuner/storage/migrations/versions/. Change both together: tests/tuner/storage/test_migrations.py fails when a
# database upgraded to head differs from this metadata.
metadata = MetaData()

# schema_version: 1 for the tables made before alembic, 2 since alembic manages them (see migration 0002); only tuners
# from before alembic read it.
meta = Table(
    "tuner_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", String(256), nullable=False),
)

# A study definition: what to search (model, space, world size, memory, global batch, budget, baseline).
# Written by `tuner search` on first use or by `POST /studies`; workers joining the study read it.
studies = Table(
    "tuner_studies",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(128), nullable=False, unique=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("definition", JSON, nullable=False),
    Column("created_by", String(32), nullable=False, default="cli"),
)

# One `tuner search` process working on a study (several at once on PostgreSQL).
search_runs = Table(
    "tuner_search_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("study_name", String(128), nullable=False, index=True),
    Column("worker", String(256), nullable=False),  # host:pid
    Column("started_at", UTCDateTime, nullable=False),
    Column("deadline_at", UTCDateTime, nullable=True),
    Column("finished_at", UTCDateTime, nullable=True),
    Column("heartbeat_at", UTCDateTime, nullable=True),
    Column("budget_s", Float, nullable=True),
    Column("status", String(16), nullable=False),  # running | finished | interrupted | failed
    Column("message", Text, nullable=True),
)

# One row per probe that ran (or was inferred without running).
probes = Table(
    "tuner_probes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("study_name", String(128), nullable=False, index=True),
    Column("trial_number", Integer, nullable=True),  # the Optuna trial this probe belongs to
    Column("run_id", Integer, ForeignKey("tuner_search_runs.id"), nullable=True),
    Column("fidelity", String(16), nullable=False),  # tuner.records.Fidelity: baseline | short | confirm | inferred
    Column("config_key", String(64), nullable=False, index=True),  # hash of the knobs + world size + accumulation
    Column("knobs", JSON, nullable=False),
    Column("config", JSON, nullable=False),  # the full ProbeConfig sent
    Column(
        "status", String(16), nullable=False
    ),  # tuner.records.ProbeStatus: ok | oom | timeout | error | inferred-oom
    Column("cause", Text, nullable=True),
    Column("samples_per_s", Float, nullable=True),
    Column("tokens_per_s", Float, nullable=True),
    Column("objective", Float, nullable=True),  # what the search maximises (retained tokens/s or samples/s)
    Column("peak_allocated", BigInteger, nullable=True),  # max over ranks
    Column("peak_reserved", BigInteger, nullable=True),
    Column("capacity", BigInteger, nullable=True),
    Column("alloc_retries", Integer, nullable=True),
    Column("stable", Boolean, nullable=False, default=False),
    Column("estimate_bytes", BigInteger, nullable=True),  # the memory estimate made before probing
    Column("probe_seconds", Float, nullable=True),  # wall clock of the probe
    Column("setup_s", Float, nullable=True),  # the probe's fixed cost: launch to first step
    Column("result", JSON, nullable=True),  # the whole ProbeResult
    Column("created_at", UTCDateTime, nullable=False),
    # the worker's idempotency key (tuner.storage.journal): a row replayed from a journal is stored once
    Column("record_uid", String(36), nullable=True),
    Index("uq_tuner_probes_record_uid", "record_uid", unique=True),
    # a page of trials reads the rows of its trials (tuner.storage.store.Store.probes_of_trials)
    Index("ix_tuner_probes_study_trial", "study_name", "trial_number"),
)

# A worker claims a config before probing it; the unique key makes "no config probed twice" hold across workers.
claims = Table(
    "tuner_claims",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("study_name", String(128), nullable=False),
    Column("config_key", String(64), nullable=False),
    Column("fidelity", String(16), nullable=False),
    Column("trial_number", Integer, nullable=True),
    Column("worker", String(256), nullable=False),
    Column("claimed_at", UTCDateTime, nullable=False),
    UniqueConstraint("study_name", "config_key", "fidelity", name="uq_claim"),
)

# -- searches across nodes (issue 43): the workers of one study, one per node, meet here (tuner.session.nodes) --------
# A worker's place as a node of a study: where its peers reach it and its beat (a node stops counting when it stops
# beating: NODE_STALE_S, tuner.records.nodes).
nodes = Table(
    "tuner_nodes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("study_name", String(128), nullable=False, index=True),
    Column("worker", String(256), nullable=False),  # host:pid
    Column("address", String(256), nullable=False),  # the address its peers reach it at (torchrun --local-addr)
    Column("nproc", Integer, nullable=False),  # ranks per node
    Column("joined_at", UTCDateTime, nullable=False),
    Column("heartbeat_at", UTCDateTime, nullable=False),
    Column("left_at", UTCDateTime, nullable=True),
    Column("message", Text, nullable=True),  # why it left
    UniqueConstraint("study_name", "worker", name="uq_tuner_nodes_worker"),
)

# The leader of a study across nodes (the one worker that runs the search and posts its probes): one row per study,
# taken over from a leader that stopped beating (compare-and-swap on its worker); ended when its search ended.
node_leases = Table(
    "tuner_node_leases",
    metadata,
    Column("study_name", String(128), primary_key=True),
    Column("worker", String(256), nullable=False),
    Column("since", UTCDateTime, nullable=False),
    Column("ended_at", UTCDateTime, nullable=True),
    Column("message", Text, nullable=True),  # why the search ended
)

# One probe across nodes as the leader posts it: every node's worker joins it and starts its torchrun agent on the
# rendezvous; any node (or the leader) sets stop_at, and every node then stops its ranks.
node_probes = Table(
    "tuner_node_probes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("study_name", String(128), nullable=False, index=True),
    Column("leader", String(256), nullable=False),
    Column("endpoint", String(300), nullable=False),  # host:port of the c10d store (the leader's agent)
    Column("rdzv_id", String(128), nullable=False),
    Column("nodes", JSON, nullable=False),  # the workers expected to join
    Column("config", JSON, nullable=False),  # the ProbeConfig
    Column("join_timeout_s", Float, nullable=False),
    Column("posted_at", UTCDateTime, nullable=False),
    Column("stop_at", UTCDateTime, nullable=True),
    Column("stop_reason", Text, nullable=True),
    Column("closed_at", UTCDateTime, nullable=True),
    Column("result", JSON, nullable=True),  # the leader's verdict over every node (a ProbeResult), once closed
)

# One node's part of a probe across nodes: joined, then its ranks' accounts (tuner.probing.accounts.NodePart).
node_parts = Table(
    "tuner_node_parts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("probe_id", Integer, ForeignKey("tuner_node_probes.id"), nullable=False, index=True),
    Column("worker", String(256), nullable=False),
    Column("joined_at", UTCDateTime, nullable=False),
    Column("finished_at", UTCDateTime, nullable=True),
    Column("result", JSON, nullable=True),
    UniqueConstraint("probe_id", "worker", name="uq_tuner_node_parts"),
)
