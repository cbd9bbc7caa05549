"""Issue 24 §6: a probe's ranks inherit no secret (their environment is readable in /proc/<pid>/environ by the user's
other processes): tuner's API token and storage URL, database passwords, variables named like a secret."""

from __future__ import annotations

from tuner.probing.environment import probe_env


def test_the_probe_environment_holds_no_secret_and_keeps_the_rest() -> None:
    base = {
        "TUNER_API_TOKEN": "tok",
        "TUNER_STORAGE": "postgresql+psycopg://u:pw@db/tuner",
        "PGPASSWORD": "pw",
        "AWS_SECRET_ACCESS_KEY": "k",
        "OPENAI_API_KEY": "k",
        "DB_PASSWORD": "pw",
        "HF_TOKEN": "hf",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "PATH": "/usr/bin",
    }
    env = probe_env(1, base=base)
    assert not {"TUNER_API_TOKEN", "TUNER_STORAGE", "PGPASSWORD", "AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY"} & set(env)
    assert "DB_PASSWORD" not in env and "pw" not in "".join(env.values()) and "tok" not in env.values()
    assert env["HF_TOKEN"] == "hf" and env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["PATH"].endswith("/usr/bin")
