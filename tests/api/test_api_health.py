"""Issue 24 §6: /health (no token) shows the storage's scheme and database name only, never a path, user, host or
port, and notices a SQLite file deleted under the running server (its open connections went on answering)."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from api.app import create_app
from tuner.settings import Settings
from tuner.storage import Store


def test_health_shows_the_scheme_and_database_name_and_notices_a_deleted_file(tmp_path: Path) -> None:
    db = tmp_path / "secret-folder" / "tuner.db"
    db.parent.mkdir()
    url = f"sqlite:///{db}"
    Store(url).ensure_study("s", {"device_memory": 1 << 29})
    client = TestClient(create_app(Settings(storage=url)))
    ok = client.get("/health")
    assert ok.status_code == 200 and ok.json()["storage"] == "sqlite database tuner.db", ok.text
    assert "secret-folder" not in ok.text
    assert client.get("/studies").status_code == 200  # the pool holds open connections to the file
    for path in db.parent.iterdir():
        path.unlink()
    gone = client.get("/health")
    assert gone.status_code == 503 and "sqlite database tuner.db is gone" in gone.json()["detail"], gone.text
    assert "secret-folder" not in gone.text
    assert not db.exists()  # noticing it made no new, empty database in its place
