"""The OpenAPI schema is complete, and the API process never imports torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from api.app import create_app
from tuner.settings import Settings

ROUTES = {
    ("/health", "get"),
    ("/studies", "get"),
    ("/studies", "post"),
    ("/studies/{name}", "get"),
    ("/studies/{name}/trials", "get"),
    ("/best-config", "get"),
}


def test_openapi_documents_every_route_with_response_models(sqlite_url) -> None:
    schema = create_app(Settings(storage=sqlite_url)).openapi()
    found = {(path, method) for path, ops in schema["paths"].items() for method in ops}
    assert found == ROUTES
    for path, method in ROUTES:
        responses = schema["paths"][path][method]["responses"]
        ok = responses["201" if method == "post" else "200"]
        assert "$ref" in ok["content"]["application/json"]["schema"], (path, method)
        if path != "/health":
            assert "$ref" in responses["422"]["content"]["application/json"]["schema"], (path, method)
        assert "503" in responses, (path, method)
    best = schema["paths"]["/best-config"]["get"]
    assert set(best["responses"]) >= {"200", "404", "422", "503"}
    fmt = next(p for p in best["parameters"] if p["name"] == "format")
    assert fmt["schema"]["enum"] == ["json", "deepspeed", "hf", "accelerate", "env", "launch", "recipe"]
    post = schema["paths"]["/studies"]["post"]
    assert set(post["responses"]) >= {"201", "401", "403", "409", "422"}
    assert post["security"] == [{"HTTPBearer": []}]
    assert "BestConfigOut" in schema["components"]["schemas"]


def test_api_process_never_imports_torch(sqlite_url) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        from tests.helpers.sample_storage import populate  # the repo root is the working directory: tests is found
        populate({sqlite_url!r}, "s")
        from fastapi.testclient import TestClient
        from api.app import create_app
        from tuner.settings import Settings
        client = TestClient(create_app(Settings(storage={sqlite_url!r})))
        for path in ("/health", "/studies", "/best-config", "/openapi.json", "/", "/ui/studies/s", "/ui/plotly.js"):
            client.get(path)
        for fmt in ("json", "deepspeed", "hf", "accelerate", "env"):
            r = client.get("/best-config", params={{"study": "s", "format": fmt}})
            assert r.status_code == 200, r.text
        loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "deepspeed", "transformers")))
        print(loaded)
        sys.exit(1 if loaded else 0)
        """
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root)
    assert out.returncode == 0, out.stdout + out.stderr
