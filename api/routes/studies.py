"""Studies: list, detail (status, budget, progress, best so far, counts), trials (paginated), create (token)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Response

from api import definitions, views
from api.deps import ServicesDep, require_token
from api.schemas import (
    STUDY_NAME_MAX,
    STUDY_NAME_PATTERN,
    ErrorOut,
    StudyCreate,
    StudyListOut,
    StudyOut,
    TrialPageOut,
    TrialStateName,
    ValidationErrorOut,
)
from tuner.records.study import StudyRecord
from tuner.storage import Store

router = APIRouter(prefix="/studies", tags=["studies"])

StudyName = Annotated[
    str, Path(min_length=1, max_length=STUDY_NAME_MAX, pattern=STUDY_NAME_PATTERN, description="the study's name")
]
MAX_PAGE = 500
COMMON: dict[int | str, dict[str, Any]] = {
    422: {"model": ValidationErrorOut},
    503: {"model": ErrorOut, "description": "storage down"},
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut, "description": "no such study"}}


@router.get("", response_model=StudyListOut, responses=COMMON)
def list_studies(svc: ServicesDep) -> StudyListOut:
    store = svc.store()
    now = store.db_now()  # the workers' heartbeats are on the database's clock
    return StudyListOut(studies=[views.summary(s, store.runs(s.name), now) for s in store.studies()])


@router.get("/{name}", response_model=StudyOut, responses={**COMMON, **NOT_FOUND})
def get_study(name: StudyName, svc: ServicesDep) -> Response:
    store = svc.store()
    detail = views.study_detail(store, svc, _row(store, name))
    # built and validated in views: FastAPI would validate it again against response_model
    return Response(detail.model_dump_json(), media_type="application/json")


def _row(store: Store, name: str) -> StudyRecord:
    row = store.study(name)
    if row is None:
        store.require_study(name)  # the one "no study named ..." line
    assert row is not None
    return row


@router.get("/{name}/trials", response_model=TrialPageOut, responses={**COMMON, **NOT_FOUND})
def list_trials(
    name: StudyName,
    svc: ServicesDep,
    offset: Annotated[int, Query(ge=0, le=10_000_000, description="trials to skip")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="trials per page")] = 50,
    state: Annotated[
        TrialStateName | None, Query(description="only trials in this Optuna state (COMPLETE, PRUNED, FAIL ...)")
    ] = None,
) -> Response:
    store = svc.store()
    _row(store, name)
    # validated once where it was built (and cached as JSON): FastAPI would validate it again against response_model
    return Response(views.trial_page(store, svc, name, offset, limit, state), media_type="application/json")


@router.post(
    "",
    response_model=StudyOut,
    status_code=201,
    dependencies=[Depends(require_token)],
    responses={
        **COMMON,
        400: {"model": ErrorOut, "description": "a definition tuner search would reject (space, model, batch)"},
        401: {"model": ErrorOut, "description": "missing or wrong bearer token"},
        403: {"model": ErrorOut, "description": "writes disabled: the server has no TUNER_API_TOKEN"},
        409: {"model": ErrorOut, "description": "a study of that name exists"},
    },
)
def create_study(body: StudyCreate, svc: ServicesDep) -> StudyOut:
    """Stores a study definition; `tuner search --study NAME` workers then join it."""
    store = svc.store()
    exists = f"study {body.name!r} already exists; pick another name or join it with a worker"
    if store.study_definition(body.name) is not None:
        raise HTTPException(409, exists)
    # the unique name decides between requests racing past the check above: only the one whose INSERT won is 201
    _, created = store.create_study(body.name, definitions.definition(body, svc.settings.storage), created_by="api")
    if not created:
        raise HTTPException(409, exists)
    return views.study_detail(store, svc, _row(store, body.name))
