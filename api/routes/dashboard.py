"""The dashboard's pages (api.dashboard): `/`, `/ui/studies/{name}`, and the plotly.js they load, served from the
package (no CDN: an air-gapped cluster has none). HTML for people; not part of the JSON API's schema."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import HTMLResponse, Response

from api import dashboard
from api.deps import ServicesDep
from api.schemas import STUDY_NAME_MAX, STUDY_NAME_PATTERN
from tuner.errors import StudyNotFound
from tuner.reporting.plotly_js import plotly_script

router = APIRouter(include_in_schema=False)

StudyName = Annotated[str, Path(min_length=1, max_length=STUDY_NAME_MAX, pattern=STUDY_NAME_PATTERN)]


@router.get("/", response_class=HTMLResponse)
def index(svc: ServicesDep) -> HTMLResponse:
    return HTMLResponse(dashboard.index_page(svc.store(), svc))


@router.get("/ui/studies/{name}", response_class=HTMLResponse)
def study(name: StudyName, svc: ServicesDep) -> HTMLResponse:
    try:
        return HTMLResponse(dashboard.study_page(svc.store(), svc, name))
    except StudyNotFound as err:
        return HTMLResponse(dashboard.not_found_page(str(err)), status_code=404)


@router.get(dashboard.PLOTLY_PATH)
def plotly_js() -> Response:
    return Response(plotly_script(), media_type="text/javascript", headers={"Cache-Control": "public, max-age=86400"})
