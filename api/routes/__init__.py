"""The API's routers, one module per resource."""

from fastapi import APIRouter

from api.routes import best, dashboard, health, studies

router = APIRouter()
router.include_router(health.router)
router.include_router(studies.router)
router.include_router(best.router)
router.include_router(dashboard.router)

__all__ = ["router"]
