"""The web console at `/ui`: servers, tools (and running one from a form), live calls and
call history, permission asks, managed text, resources, prompts and metrics plots.
Server-rendered HTML with a little plain JavaScript (no build step, nothing fetched at run
time).

Owns: `console_routes(...)`, the console's login sessions and `MinuteRing` (the per-minute
numbers its metrics page plots, a seam observer the app attaches). May import the core,
`managed_store`, the face `bridges.mcp.oauth` and `sidecar.serve` helpers; nothing imports
it but the HTTP app.

Security: the bearer token is typed once into a login form; the console then uses an
HttpOnly, SameSite=Strict cookie scoped to `/ui`. Every state-changing request is a POST that
carries the session's CSRF token and, when the browser sends one, a local `Origin` (the
`SecurityMiddleware` checks Host and Origin before the console runs).
"""

from sidecar.serve.console.minute_ring import MinuteRing
from sidecar.serve.console.routes import console_routes

__all__ = ["MinuteRing", "console_routes"]
