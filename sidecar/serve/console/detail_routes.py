"""The console's routes about one thing (`DetailPages`): a tool and its runs, a server, a call,
the upstream servers' resources and prompts, and the metrics plots. The guard (login, CSRF)
and the page layout come from `routes.Console`, which mounts these.

Imports the core, the face `bridges.mcp.oauth`, `sidecar.serve.upstream_access` and the rest
of the console. Exports `DetailPages`, `BadInput` and `Render`.
"""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse

from bridges.mcp.oauth import grant_status
from sidecar.execution.snapshot import Snapshot
from sidecar.model.tool import ToolContext
from sidecar.registry.profiles import UnknownProfile
from sidecar.serve.console import detail_pages as views
from sidecar.serve.console import pages
from sidecar.serve.console.auth import ConsoleSession
from sidecar.serve.console.minute_ring import MinuteRing
from sidecar.serve.console.tool_form import FormProblem, form_input
from sidecar.serve.tool_tokens import tool_tokens
from sidecar.serve.upstream_access import (
    UpstreamProblem,
    get_prompt,
    list_prompts,
    list_resources,
    read_resource,
    restart_server,
    server_stderr,
)
from sidecar.serve.upstream_api import UpstreamApi
from sidecar.stores.call_history import CallQuery

if TYPE_CHECKING:
    from sidecar.location.location import Location

Render = Callable[..., Response]
"""`routes._page(title, body, session, active, script="", status=200)`."""
LOOKED_AT = 1000
"""History rows a call page looks through for a call without a hint of its time."""


class BadInput(Exception):
    """A request the page cannot answer (400, the message shown)."""


class DetailPages:
    def __init__(self, location: Location, render: Render, ring: MinuteRing | None) -> None:
        self.location = location
        self.render = render
        self.ring = ring or MinuteRing()

    def routes(self) -> list[tuple[str, Any, str]]:
        """(path, handler, method); `routes.Console` guards them."""
        return [
            ("/ui/tools/{name}", self.tool, "GET"),
            ("/ui/tools/{name}/run", self.run, "POST"),
            ("/ui/servers/{name}", self.server, "GET"),
            ("/ui/servers/{name}/restart", self.restart, "POST"),
            ("/ui/servers/{name}/stderr", self.stderr, "GET"),
            ("/ui/calls/{call_id}", self.call, "GET"),
            ("/ui/resources", self.resources, "GET"),
            ("/ui/resources/download", self.download, "GET"),
            ("/ui/prompts", self.prompts, "GET"),
            ("/ui/prompts", self.prompts, "POST"),
            ("/ui/metrics", self.metrics, "GET"),
        ]

    # --- tools -------------------------------------------------------------------------

    def _profile(self, raw: Any) -> str:
        profiles = self.location.profiles
        chosen = raw if isinstance(raw, str) and raw else profiles.default_name
        if chosen != views.ALL_TOOLS and not profiles.exists(chosen):
            raise BadInput(f"no profile {chosen!r}; the profiles: {', '.join(profiles.names())}")
        return chosen

    def snapshot(self, profile: str, session_id: str | None = None) -> Snapshot:
        location = self.location
        if profile == views.ALL_TOOLS:  # every tool, whichever profile serves it
            served = location.profiles.entries(None, location.registry.effective())
            return Snapshot(location.seam, served, session_id=session_id)
        try:
            return location.snapshot(session_id=session_id, keep=False, profile=profile,
                                     hide_denied=False, expose="all")
        except UnknownProfile as exc:
            raise BadInput(str(exc)) from None

    def _pin(self, name: str) -> dict[str, Any] | None:
        entry = self.location.registry.effective().get(name)
        if entry is None or not entry.origin.startswith("mcp:"):
            return None
        pins = self.location.pins
        key = f"{entry.origin[4:]}/{entry.key}"
        held = pins.held.get(key)
        if held is not None:
            return {"held": held.action.replace("_", " ")}
        pin = pins.pins.get(key)
        return {"pinned_at": pin.pinned_at} if pin is not None else None

    async def _tool_page(self, request: Request, session: ConsoleSession, profile: str,
                         values: dict[str, str], result: str, status: int = 200) -> Response:
        name = request.path_params["name"]
        snapshot = self.snapshot(profile)
        definition = next((d for d in snapshot.definitions if d.name == name), None)
        if definition is None:
            everything = self.snapshot(views.ALL_TOOLS).definitions
            definition = next((d for d in everything if d.name == name), None)
            if definition is None:
                raise BadInput(f"no tool named {name!r}")
            result = (f'<p class=warn>Profile {profile!r} does not serve {name}: choose '
                      f"another to run it.</p>{result}")
        tokens = (await tool_tokens(self.location, [definition])).tools.get(name)
        label = self.location.registry.source_of(name) or ""
        body = views.tool_page(
            definition, server=label.removeprefix("mcp:") if label.startswith("mcp:") else None,
            tokens=tokens, pin=self._pin(name), profiles=self.location.profiles.names(),
            profile=profile, csrf=session.csrf, values=values, result=result)
        return self.render(name, body, session, "tools", status=status)

    async def tool(self, request: Request, session: ConsoleSession) -> Response:
        profile = self._profile(request.query_params.get("profile"))
        return await self._tool_page(request, session, profile, {}, "")

    async def run(self, request: Request, session: ConsoleSession) -> Response:
        name = request.path_params["name"]
        form = await request.form()
        values = {k: v for k, v in form.items() if isinstance(v, str) and k != "csrf"}
        profile = self._profile(values.get("profile"))
        snapshot = self.snapshot(profile, session.label)
        definition = next((d for d in snapshot.definitions if d.name == name), None)
        try:
            raw_input = form_input(definition.input_schema if definition else {}, values)
        except FormProblem as exc:
            problem = f'<p class=bad id=form-problem>{pages.e(exc)}</p>'
            return await self._tool_page(request, session, profile, values, problem, 400)
        call_id = "ui_" + secrets.token_hex(8)
        started = time.time()
        outcome = await snapshot.execute(name, raw_input, ToolContext(
            session.label, "console", call_id, call_id))
        link = f"/ui/calls/{call_id}?session={session.label}&at={int(started)}"
        result = views.outcome_view(outcome.to_json(), call_link=link)
        return await self._tool_page(request, session, profile, values, result)

    # --- servers -----------------------------------------------------------------------

    def _auth(self, name: str) -> tuple[bool, Any]:
        sourced = self.location.manifests.servers.get(name)
        config = sourced.value if sourced is not None else None
        oauth = config is not None and config.url is not None and config.oauth_mode != "none"
        return oauth, config

    async def server(self, request: Request, session: ConsoleSession) -> Response:
        name = request.path_params["name"]
        health = self.location.server_health().get(name)
        if health is None:
            raise BadInput(f"no MCP server named {name!r}")
        oauth, config = self._auth(name)
        auth = None
        if oauth:
            try:
                record = await self.location.grant_store().get(name)
            except Exception as exc:  # a grant store that cannot be read: say so
                auth = {"reason": f"the grant store cannot be read: {exc}"}
            else:
                auth = grant_status(name, config, record, time.time())
        registry = self.location.registry
        tools = sorted(n for n in registry.effective() if registry.source_of(n) == f"mcp:{name}")
        mark, text = server_stderr(self.location, name)
        body = views.server_page(name, health.to_json(), tools=tools, auth=auth,
                                 csrf=session.csrf, stderr_mark=mark, stderr=text, oauth=oauth)
        return self.render(name, body, session, "servers", script=views.STDERR_SCRIPT)

    async def restart(self, request: Request, session: ConsoleSession) -> Response:
        name = request.path_params["name"]
        try:
            await restart_server(self.location, name)
        except UpstreamProblem as exc:
            raise BadInput(exc.message) from None
        return RedirectResponse(f"/ui/servers/{name}", status_code=303)

    async def stderr(self, request: Request, session: ConsoleSession) -> Response:
        name = request.path_params["name"]
        raw = request.query_params.get("after", "0")
        after = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 18 else 0
        try:
            server_stderr(self.location, name, after)
        except UpstreamProblem as exc:
            raise BadInput(exc.message) from None
        return StreamingResponse(UpstreamApi(self.location).follow(name, after),
                                 media_type="text/event-stream",
                                 headers={"cache-control": "no-store"})

    # --- calls -------------------------------------------------------------------------

    async def call(self, request: Request, session: ConsoleSession) -> Response:
        call_id = request.path_params["call_id"]
        row = await self._row(call_id, request.query_params.get("session", ""),
                              request.query_params.get("at", ""))
        outcome = await self.location.outcome(call_id)
        if row is None and outcome is None:
            raise BadInput(f"no call {call_id!r} in the history or the outcome log")
        body = views.call_page(call_id, row, outcome.to_json() if outcome else None,
                               self.ring.trace_ids.get(call_id))
        return self.render(f"Call {call_id}", body, session, "calls")

    async def _row(self, call_id: str, session_id: str, at: str) -> Any:
        history = self.location.stores.history
        if history is None:
            return None
        queries = [CallQuery(limit=LOOKED_AT)]
        if at.isascii() and at.isdigit() and len(at) <= 12:
            queries.insert(0, CallQuery(session=session_id or None, since=int(at) - 2,
                                        until=int(at) + 3600, limit=LOOKED_AT))
        for query in queries:
            rows, _ = await history.query(query)
            found = next((r for r in rows if r.call_id == call_id), None)
            if found is not None:
                return found
        return None

    # --- resources and prompts ---------------------------------------------------------

    async def resources(self, request: Request, session: ConsoleSession) -> Response:
        profile = self._profile(request.query_params.get("profile"))
        upstream_profile = None if profile == views.ALL_TOOLS else profile
        uri = request.query_params.get("uri", "")
        shown = ""
        try:
            if uri:
                shown = views.resource_view(
                    await read_resource(self.location, upstream_profile, uri), profile)
            listing = await list_resources(self.location, upstream_profile)
        except UpstreamProblem as exc:
            raise BadInput(exc.message) from None
        body = views.resources_page(listing, self.location.profiles.names(), profile, shown)
        return self.render("Resources", body, session, "resources")

    async def download(self, request: Request, session: ConsoleSession) -> Response:
        params = request.query_params
        profile = self._profile(params.get("profile"))
        part = params.get("part", "0")
        try:
            read = await read_resource(self.location, None if profile == views.ALL_TOOLS
                                       else profile, params.get("uri", ""))
        except UpstreamProblem as exc:
            raise BadInput(exc.message) from None
        contents = read["contents"]
        if not (part.isascii() and part.isdigit() and int(part) < len(contents)):
            raise BadInput(f"part: the resource has {len(contents)} parts")
        chosen = contents[int(part)]
        data = (chosen["text"].encode() if chosen.get("text") is not None
                else base64.b64decode(chosen.get("blob", "")))
        mime = chosen.get("mime_type") or "application/octet-stream"
        tail = str(chosen.get("uri", "resource")).rstrip("/").rsplit("/", 1)[-1] or "resource"
        filename = "".join(c if c.isalnum() or c in "._-" else "_" for c in tail)[:100]
        return Response(data, media_type=mime, headers={
            "content-disposition": f'attachment; filename="{filename}"'})

    async def prompts(self, request: Request, session: ConsoleSession) -> Response:
        values: dict[str, str] = {}
        if request.method == "POST":
            form = await request.form()
            values = {k: v for k, v in form.items() if isinstance(v, str)}
        else:
            values = dict(request.query_params)
        profile = self._profile(values.get("profile"))
        upstream_profile = None if profile == views.ALL_TOOLS else profile
        chosen, shown = values.get("name", ""), ""
        try:
            if chosen and request.method == "POST":
                arguments = {k[4:]: v for k, v in values.items() if k.startswith("arg:") and v}
                shown = views.prompt_view(await get_prompt(
                    self.location, upstream_profile, chosen, arguments))
            listing = await list_prompts(self.location, upstream_profile)
        except UpstreamProblem as exc:
            shown = f'<p class=bad id=prompt-problem>{pages.e(exc.message)}</p>'
            listing = await list_prompts(self.location, upstream_profile)
        body = views.prompts_page(listing, self.location.profiles.names(), profile,
                                  session.csrf, chosen, values, shown)
        return self.render("Prompts", body, session, "prompts")

    # --- metrics -----------------------------------------------------------------------

    async def metrics(self, request: Request, session: ConsoleSession) -> Response:
        try:
            stats = await self.location.seam.store.stats()
            objects: int | None = int(stats.count)
            self.ring.sample_store(int(stats.bytes))
        except Exception:  # a fleet store that does not answer: the plots still show
            objects = None
        body = views.metrics_page(self.ring.hour(), objects)
        return self.render("Metrics", body, session, "metrics")

