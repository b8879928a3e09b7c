"""The Recovery Console: server-rendered pages served by the receiver under `/console`.

`router` (a FastAPI APIRouter) holds every page; `recovery.app.create_app` includes it.
Pages: incidents (live list), incident detail, approvals, audit, policy and health.
"""

from recovery.console.views import router

__all__ = ["router"]
