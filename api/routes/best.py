"""GET /best-config: the best stable config of a study, in the format a training job consumes, with provenance."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import PlainTextResponse, Response

from api import views
from api.deps import ServicesDep
from api.schemas import STUDY_NAME_MAX, STUDY_NAME_PATTERN, BestConfigOut, ErrorOut, Format, ValidationErrorOut

router = APIRouter(tags=["best-config"])

MEDIA = {"json": "application/json", "deepspeed": "application/json", "hf": "application/json"}


@router.get(
    "/best-config",
    response_model=BestConfigOut,
    responses={
        200: {"content": {"text/plain": {}}, "description": "with raw=true: only the rendered config file"},
        404: {"model": ErrorOut, "description": "unknown study, or no stable trial yet"},
        422: {"model": ValidationErrorOut},
        503: {"model": ErrorOut, "description": "storage down"},
    },
)
def best_config(
    svc: ServicesDep,
    study: Annotated[
        str | None,
        Query(
            max_length=STUDY_NAME_MAX,
            pattern=STUDY_NAME_PATTERN,
            description="the study; required unless the server was started with --default-study",
        ),
    ] = None,
    format: Annotated[Format, Query(description="json | deepspeed | hf | accelerate | env | launch | recipe")] = "json",
    raw: Annotated[bool, Query(description="answer only the config file body (for curl > ds_config.json)")] = False,
) -> Response:
    name = study or svc.settings.default_study
    if name is None:  # never "the newest study": any POST /studies would become what every consumer gets
        raise HTTPException(
            422,
            "study= is required: GET /best-config?study=NAME (GET /studies lists them), or start the server with "
            "`tuner serve --default-study NAME`",
        )
    store = svc.store()
    out = svc.cache.get(
        store, name, format, lambda: views.best_config(store, name, format, views.ranked(store, svc, name))
    )
    if not raw:  # validated where it was built (and cached): FastAPI would validate it again against response_model
        return Response(out.model_dump_json(), media_type="application/json")
    headers = {"X-Tuner-Caveat": out.caveat} if out.caveat else None  # the raw body is the file: no room in it
    if format == "json":
        body = {
            "knobs": out.knobs,
            "world_size": out.world_size,
            "gradient_accumulation_steps": out.gradient_accumulation_steps,
        }
        return Response(json.dumps(body, indent=2) + "\n", media_type="application/json", headers=headers)
    return PlainTextResponse(out.content or "", media_type=MEDIA.get(format, "text/plain"), headers=headers)
