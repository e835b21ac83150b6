"""HTML of the console's pages about one thing: a tool (its definition, its form and a run's
result), a server (its health, tools and stderr), a call, the resources and prompts of the
upstream servers, and the metrics plots. Plain functions from data to markup, every value
escaped (`pages.e`).

Imports the rest of the console's markup (`pages`, `charts`, `tool_form`, `minute_ring`).
Exports `tool_page`, `outcome_view`, `server_page`, `call_page`, `resources_page`,
`resource_view`, `prompts_page`, `prompt_view`, `metrics_page`, `profile_choice`,
`ALL_TOOLS`, `STDERR_SCRIPT`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

from sidecar.serve.console.charts import line_chart
from sidecar.serve.console.minute_ring import Minute, quantile
from sidecar.serve.console.pages import e, table, when
from sidecar.serve.console.tool_form import RAW, schema_fields

ALL_TOOLS = "*"
"""The profile choice that serves every tool (the all-access token's view)."""
SHOWN_CHARS = 20_000
"""Characters of one text item shown on a page (bounded content is at most 50 KiB anyway)."""


def _cut(text: str, limit: int = SHOWN_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n… ({len(text) - limit:,} more)"


def _json(value: Any) -> str:
    return f"<pre>{e(_cut(json.dumps(value, indent=2, ensure_ascii=False)))}</pre>"


def profile_choice(profiles: Sequence[str], chosen: str, *, label: str = "profile") -> str:
    options = "".join(
        f'<option value="{e(name)}"{" selected" if name == chosen else ""}>'
        f'{"(all tools)" if name == ALL_TOOLS else e(name)}</option>'
        for name in [*profiles, ALL_TOOLS])
    return f'<label>{label} <select name=profile>{options}</select></label>'


def _pin(pin: Mapping[str, Any] | None) -> str:
    if pin is None:
        return "not pinned (not an MCP server's tool, or its server's pin policy is off)"
    if pin.get("held"):
        return (f'<span class=warn>changed upstream: {e(pin["held"])} (approve it on the '
                f'<a href="/ui/tools">tools page</a>)</span>')
    return f'pinned {e(when(pin.get("pinned_at")))}'


def tool_page(definition: Any, *, server: str | None, tokens: int | None,
              pin: Mapping[str, Any] | None, profiles: Sequence[str], profile: str,
              csrf: str, values: Mapping[str, str], result: str) -> str:
    d = definition
    facts = [("server", e(server or "built in or a manifest tool")),
             ("title", e(d.title or "")), ("pin", _pin(pin))]
    if tokens is not None:
        facts.append(("tokens", f'<span class=tokens>{tokens:,}</span> (name, description and '
                                "input schema as the model sees them)"))
    if d.annotations:
        facts.append(("annotations", ", ".join(f"{e(k)}: <code>{e(json.dumps(v))}</code>"
                                               for k, v in d.annotations.items())))
    listed = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in facts if value)
    fields = schema_fields(d.input_schema, values)
    if not fields:
        fields = ('<p class=muted>This schema has no properties to make fields of: give the '
                  'input as JSON below.</p>')
    raw = values.get(RAW, "")
    form = (f'<form method=post action="/ui/tools/{quote(d.name, safe="")}/run" class=card '
            f'id=run><input type=hidden name=csrf value="{e(csrf)}"><h2>Run</h2>{fields}'
            f'<details{" open" if raw else ""}><summary>raw JSON input (replaces the fields)'
            f'</summary><label for=raw-input>input as JSON</label><textarea id=raw-input '
            f'name={RAW} rows=5 cols=70>{e(raw)}</textarea></details>'
            f'<p>{profile_choice(profiles, profile)} <button>Run</button> <span class=muted>'
            'through the seam, as the console\'s session</span></p></form>')
    schemas = (f"<details><summary>input schema</summary>{_json(d.input_schema)}</details>"
               + (f"<details><summary>output schema</summary>{_json(d.output_schema)}"
                  "</details>" if d.output_schema else ""))
    return (f"<p>{e(d.description)}</p><dl class=facts>{listed}</dl>{schemas}{form}{result}")


def _content_item(item: Mapping[str, Any], tool: str) -> str:
    kind = item.get("type")
    if kind == "text":
        return f'<pre class=content>{e(_cut(str(item.get("text", ""))))}</pre>'
    if kind == "image":
        return (f'<img class=content src="data:{e(item.get("mime_type"))};base64,'
                f'{e(item.get("data"))}" alt="an image {e(tool)} returned">')
    if kind == "audio":
        size = len(str(item.get("data", ""))) * 3 // 4
        return f'<p class=muted>audio, {e(item.get("mime_type"))}, about {size:,} bytes</p>'
    if kind == "resource":
        body = (f'<pre>{e(_cut(str(item["text"])))}</pre>' if item.get("text") is not None
                else f'<p class=muted>{len(str(item.get("blob", ""))) * 3 // 4:,} bytes</p>')
        return f'<p>resource <code>{e(item.get("uri"))}</code></p>{body}'
    return (f'<p>link to <a href="/ui/resources?{e(urlencode({"uri": item.get("uri", "")}))}">'
            f'<code>{e(item.get("uri"))}</code></a> {e(item.get("name") or "")}</p>')


def outcome_view(outcome: Mapping[str, Any], *, heading: str = "Result",
                 call_link: str | None = None) -> str:
    """A call's outcome (`Outcome.to_json()`): status, error, content, output, refs."""
    status = outcome.get("status")
    ok = status == "completed"
    parts = [f'<h2>{e(heading)}</h2><p id=status>status <strong class="{"ok" if ok else "bad"}">'
             f'{e(status)}</strong>'
             + (f' · <a href="{e(call_link)}">the call in full</a>' if call_link else "")
             + "</p>"]
    error = outcome.get("error")
    if error:
        path = f' at <code>{e(error["path"])}</code>' if error.get("path") else ""
        ident = f' (error id <code>{e(error["error_id"])}</code>)' if error.get(
            "error_id") else ""
        parts.append(f'<div class="card error-box" id=error><p><strong class=bad>'
                     f'{e(error.get("kind"))}</strong>{path}{ident}</p>'
                     f'<pre class=bad>{e(_cut(str(error.get("message", ""))))}</pre></div>')
    tool = str(outcome.get("tool", ""))
    content = outcome.get("content") or []
    if content:
        parts.append("<h3>content</h3>" + "".join(_content_item(i, tool) for i in content))
    if outcome.get("output") is not None:
        parts.append(f"<h3>structured output</h3>{_json(outcome['output'])}")
    managed = outcome.get("managed") or []
    if managed:
        links = "".join(f'<li><a href="/ui/managed?ref={e(m.get("ref"))}">{e(m.get("ref"))}'
                        f'</a> ({e(m.get("size_bytes"))} bytes retained whole)</li>'
                        for m in managed)
        parts.append(f"<h3>retained text</h3><ul>{links}</ul>")
    if outcome.get("metadata"):
        parts.append(f"<h3>metadata</h3>{_json(outcome['metadata'])}")
    if outcome.get("partial"):
        parts.append(f"<h3>partial</h3>{_json(outcome['partial'])}")
    return f'<section class=card id=result>{"".join(parts)}</section>'


def _sandbox(sandbox: Any) -> str:
    if not isinstance(sandbox, dict):
        return "none"
    return ", ".join(f"{k}: {json.dumps(v)}" for k, v in sandbox.items())


def server_page(name: str, health: Mapping[str, Any], *, tools: Sequence[str],
                auth: Mapping[str, Any] | None, csrf: str, stderr_mark: int,
                stderr: str, oauth: bool) -> str:
    h = health
    facts = [("state", f'<strong id=state>{e(h.get("state"))}</strong> since '
                       f'{e(when(h.get("since")))}'),
             ("transport", e(h.get("transport"))), ("era", e(h.get("protocol_version") or "")),
             ("sandbox", e(_sandbox(h.get("sandbox")))), ("restarts", e(h.get("restarts"))),
             ("process", e(h.get("pid") or "")), ("last error", e(h.get("last_error") or ""))]
    if auth is not None:
        state = ("authorized" if auth.get("authorized") else "not authorized") + (
            f', expires {when(auth["expires_at"])}' if auth.get("expires_at") else "")
        if auth.get("reason"):
            state += f' ({auth["reason"]})'
        facts.append(("OAuth", e(state)))
    listed = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    hidden = f'<input type=hidden name=csrf value="{e(csrf)}">'
    action = quote(name, safe="")
    buttons = (f'<form class=inline method=post action="/ui/servers/{action}/restart">{hidden}'
               f'<button>restart</button></form>')
    if oauth:
        buttons += (f' <form class=inline method=post action="/ui/servers/{action}/login">'
                    f'{hidden}<button>log in</button></form>')
    tool_links = " ".join(f'<a href="/ui/tools/{quote(t, safe="")}">{e(t)}</a>' for t in tools)
    return (f'<dl class=facts>{listed}</dl><p>{buttons}</p><h2>Tools ({len(tools)})</h2>'
            f'<p>{tool_links or "<span class=muted>none registered</span>"}</p>'
            f'<h2>stderr</h2><p class=muted>The last 64 KiB the process wrote (secrets '
            f'redacted), followed live.</p><pre id=stderr aria-live=off '
            f'data-follow="/ui/servers/{e(action)}/stderr?after={stderr_mark}">'
            f'{e(stderr)}</pre>')


STDERR_SCRIPT = """<script>
const tail = document.getElementById('stderr');
const follow = new EventSource(tail.dataset.follow);
follow.addEventListener('stderr', (ev) => {
  const text = JSON.parse(ev.data).text;
  const bottom = tail.scrollTop + tail.clientHeight >= tail.scrollHeight - 4;
  tail.textContent = (tail.textContent + text).slice(-65536);
  if (bottom) tail.scrollTop = tail.scrollHeight;
});
follow.addEventListener('gone', () => follow.close());
</script>"""


def call_page(call_id: str, row: Any, outcome: Mapping[str, Any] | None,
              trace_id: str | None) -> str:
    facts: list[tuple[str, str]] = [("call", f"<code>{e(call_id)}</code>")]
    if row is not None:
        status = e(row.status) + (f" {e(row.error_kind)}" if row.error_kind else "")
        facts += [("tool", (f"{e(row.server)}/" if row.server else "") +
                   f'<a href="/ui/tools/{quote(row.tool, safe="")}">{e(row.tool)}</a>'),
                  ("status", status + (" (replayed)" if row.replayed else "")),
                  ("started", e(when(row.started_at))), ("duration", f"{row.duration_ms} ms"),
                  ("session", e(row.session_id)), ("agent", e(row.agent)),
                  ("message", e(row.message_id)), ("profile", e(row.profile or "")),
                  ("bytes in / out", f"{row.input_bytes:,} / {row.content_bytes:,}"),
                  ("tokens", "" if row.content_tokens is None else f"{row.content_tokens:,}")]
    facts.append(("trace id", f"<code>{e(trace_id)}</code>" if trace_id else
                  '<span class=muted>not recorded (tracing off, or not called here since '
                  'the daemon started)</span>'))
    listed = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts if v)
    parts = [f"<dl class=facts>{listed}</dl>"]
    if row is not None:
        kept = ("" if row.input is not None else
                '<p class=muted>not kept (the audit setting keeps no inputs)</p>')
        parts.append(f"<h2>Input as kept</h2>{kept or _json(row.input)}")
        if row.error:
            parts.append(f'<h2>Error</h2><pre class=bad id=error>{e(row.error)}</pre>')
    else:
        parts.append('<p class=muted>The call history has no row for this call (not kept, '
                     'or older than the rows looked at).</p>')
    if outcome is not None:
        parts.append(outcome_view(outcome, heading="Outcome (from the outcome log)"))
    return "".join(parts)


def resources_page(listing: Mapping[str, Any], profiles: Sequence[str], profile: str,
                   shown: str) -> str:
    choose = (f'<form method=get class=card>{profile_choice(profiles, profile)} '
              f'<button>show</button></form>')
    by_server: dict[str, list[Mapping[str, Any]]] = {}
    for r in listing.get("resources", []):
        by_server.setdefault(r["server"], []).append(r)
    sections = []
    for server, items in by_server.items():
        rows = [[f'<a href="/ui/resources?{e(urlencode({"uri": r["uri"], "profile": profile}))}'
                 f'">{e(r.get("name") or r["uri"])}</a>', f'<code>{e(r["uri"])}</code>',
                 e(r.get("mime_type") or ""), e(r.get("description") or "")] for r in items]
        sections.append(f"<h2>{e(server)}</h2>" + table(
            ["name", "URI", "type", "description"], rows, empty=""))
    templates = listing.get("templates", [])
    if templates:
        sections.append("<h2>URI templates</h2>" + table(
            ["server", "template", "name", "description"],
            ([e(t["server"]), f'<code>{e(t["uri_template"])}</code>', e(t.get("name")),
              e(t.get("description") or "")] for t in templates), empty=""))
    read = (f'<form method=get class=card><label>read a URI <input name=uri size=60 '
            f'value=""></label><input type=hidden name=profile value="{e(profile)}"> '
            "<button>read</button></form>")
    body = "".join(sections) or '<p class=muted>No server offers resources.</p>'
    return f"{choose}{shown}{read}{body}"


def resource_view(read: Mapping[str, Any], profile: str) -> str:
    parts = [f'<h2>{e(read["uri"])}</h2><p class=muted>from {e(read["server"])}</p>']
    for n, c in enumerate(read.get("contents", [])):
        mime = str(c.get("mime_type") or "")
        if c.get("text") is not None:
            parts.append(f'<pre class=content>{e(_cut(str(c["text"])))}</pre>')
        elif mime.startswith("image/"):
            parts.append(f'<img class=content src="data:{e(mime)};base64,{e(c.get("blob"))}" '
                         f'alt="{e(c.get("uri"))}">')
        else:
            size = len(str(c.get("blob", ""))) * 3 // 4
            parts.append(f'<p>{e(mime or "binary")}, {size:,} bytes</p>')
        query = urlencode({"uri": read["uri"], "profile": profile, "part": n})
        parts.append(f'<p><a href="/ui/resources/download?{e(query)}">download</a></p>')
    return f'<section class=card id=resource>{"".join(parts)}</section>'


def prompts_page(listing: Mapping[str, Any], profiles: Sequence[str], profile: str,
                 csrf: str, chosen: str, values: Mapping[str, str], shown: str) -> str:
    choose = (f'<form method=get class=card>{profile_choice(profiles, profile)} '
              f'<button>show</button></form>')
    sections: dict[str, list[str]] = {}
    for p in listing.get("prompts", []):
        args = p.get("arguments") or []
        fields = "".join(
            f'<div class=field><label for="a-{i}-{e(p["name"])}">{e(a["name"])}'
            f'{" <abbr class=req title=required>*</abbr>" if a.get("required") else ""}'
            f'</label> <input id="a-{i}-{e(p["name"])}" name="arg:{e(a["name"])}" size=40 '
            f'value="{e(values.get("arg:" + a["name"], "") if p["name"] == chosen else "")}" '
            f'aria-required="{"true" if a.get("required") else "false"}"> '
            f'<small class=muted>{e(a.get("description") or "")}</small></div>'
            for i, a in enumerate(args))
        sections.setdefault(p["server"], []).append(
            f'<form method=post action="/ui/prompts" class=card><input type=hidden name=csrf '
            f'value="{e(csrf)}"><input type=hidden name=name value="{e(p["name"])}">'
            f'<input type=hidden name=profile value="{e(profile)}"><h3>{e(p["name"])}</h3>'
            f'<p>{e(p.get("description") or "")}</p>{fields}<button>get</button></form>'
            + (shown if p["name"] == chosen else ""))
    body = "".join(f"<h2>{e(server)}</h2>{''.join(forms)}" for server, forms in sections.items())
    return choose + (body or '<p class=muted>No server offers prompts.</p>')


def prompt_view(got: Mapping[str, Any]) -> str:
    parts = []
    for m in got.get("messages", []):
        c = m.get("content") or {}
        if c.get("type") == "text":
            inner = f'<pre class=content>{e(_cut(str(c.get("text", ""))))}</pre>'
        elif c.get("type") == "image":
            inner = (f'<img class=content src="data:{e(c.get("mime_type"))};base64,'
                     f'{e(c.get("data"))}" alt="an image in the prompt">')
        else:
            inner = _json(c)
        parts.append(f'<div class=message><p><strong>{e(m.get("role"))}</strong></p>{inner}'
                     "</div>")
    description = f'<p>{e(got["description"])}</p>' if got.get("description") else ""
    return f'<section class=card id=prompt>{description}{"".join(parts)}</section>'


TOP_TOOLS = 6


def metrics_page(hour: Sequence[Minute], store_objects: int | None) -> str:
    minutes = [m.start for m in hour]
    merged: dict[str, list[int]] = {}
    calls: dict[str, int] = {}
    for m in hour:
        for tool, counts in m.latency.items():
            total = merged.setdefault(tool, [0] * len(counts))
            for i, n in enumerate(counts):
                total[i] += n
            calls[tool] = calls.get(tool, 0) + sum(counts)
    top = sorted(calls, key=lambda t: (-calls[t], t))[:TOP_TOOLS]
    kinds = sorted({k for m in hour for k in m.errors})
    charts = [
        line_chart("Calls per second", minutes,
                   [("all calls", [m.calls / 60 if m.calls else 0.0 for m in hour])],
                   "calls/s", "calls-per-second"),
        line_chart("p50 latency per tool", minutes,
                   [(t, [quantile(m.latency[t], 0.5) if t in m.latency else None
                         for m in hour]) for t in top], "ms", "latency-p50"),
        line_chart("p99 latency per tool", minutes,
                   [(t, [quantile(m.latency[t], 0.99) if t in m.latency else None
                         for m in hour]) for t in top], "ms", "latency-p99"),
        line_chart("Errors by kind", minutes,
                   [(k, [float(m.errors.get(k, 0)) for m in hour]) for k in kinds],
                   "errors/minute", "errors"),
        line_chart("Managed store size", minutes,
                   [("retained text", [None if m.store_bytes is None
                                       else m.store_bytes / 1048576 for m in hour])],
                   "MiB", "store-size"),
    ]
    rows = [[e(t), f"{calls[t]:,}", e(quantile(merged[t], 0.5)), e(quantile(merged[t], 0.99))]
            for t in sorted(calls, key=lambda t: (-calls[t], t))]
    summary = table(["tool", "calls", "p50 ms", "p99 ms"], rows,
                    empty="No calls in the last hour.")
    objects = f" · {store_objects:,} objects retained now" if store_objects is not None else ""
    return (f'<p class=muted>This daemon\'s own numbers since it started, a minute at a time '
            f'(latencies within 25 %){objects}; all of them are also at '
            f'<code>/metrics</code>.</p>{"".join(charts)}<h2>The last hour per tool</h2>'
            f"{summary}")
