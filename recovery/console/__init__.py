"""The Recovery Console: server-rendered pages served by the receiver under `/console`.

`router` (a FastAPI APIRouter) holds every page; `recovery.app.create_app` includes it.
Pages: login (`session`), incidents and incident detail (`incident_pages`), approvals and the
pause switch (`decisions`), audit, policy and nodes (`operations`); `page` renders and guards
them, `templating` holds the templates' filters and words.
"""

from fastapi import APIRouter

from recovery.console import decisions, incident_pages, operations, session

router = APIRouter()
for _pages in (session, incident_pages, decisions, operations):
    router.include_router(_pages.router)

__all__ = ["router"]
