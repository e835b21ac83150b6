"""HTML of the console's pages: plain functions from data to markup, every value escaped.
Imports nothing of ours. Exports one function per page (`servers_page`, `tools_page`,
`asks_page`, `calls_page`, `managed_page`, `login_page`), their parts (`layout`, `table`,
`history_table`, ...) and `e` (escape).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

NAV = (("servers", "/ui"), ("tools", "/ui/tools"), ("calls", "/ui/calls"),
       ("asks", "/ui/asks"), ("managed", "/ui/managed"), ("resources", "/ui/resources"),
       ("prompts", "/ui/prompts"), ("metrics", "/ui/metrics"))

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2430;background:#f6f7f9;
overflow-wrap:anywhere}
header{background:#1d2430;color:#fff;padding:.6em 1.2em;display:flex;gap:1.2em;align-items:center}
header a{color:#cfd8e6;text-decoration:none}header a.on{color:#fff;font-weight:600}
header nav{display:flex;gap:1.2em;flex-wrap:wrap}
header form{margin-left:auto}main{padding:1em 1.4em;max-width:1200px}
table{border-collapse:collapse;width:100%;background:#fff}
th,td{border-bottom:1px solid #e3e6ea;padding:.35em .5em;text-align:left;vertical-align:top}
th{background:#eef1f5;font-weight:600;overflow-wrap:normal}.num{white-space:nowrap;overflow-wrap:normal}
.when,.status{overflow-wrap:normal}.when span{white-space:nowrap}.id{min-width:6em}
.name{min-width:10em}.short{min-width:5em}.input{min-width:10em}
tr.failure td{border-top:0;padding-top:0}tr.failed td{border-bottom:0}
.error{white-space:pre-wrap}pre{background:#fff;border:1px solid #e3e6ea;
padding:.6em;overflow:auto;max-height:60vh;white-space:pre-wrap;word-break:break-all}
.ok{color:#11712f}.bad{color:#b3261e}.warn{color:#8a5a00}.muted{color:#535a64}
form.inline{display:inline}input,select,button{font:inherit;padding:.2em .4em}
fieldset{border:1px solid #e3e6ea;background:#fff;margin:.6em 0}
.card{background:#fff;border:1px solid #e3e6ea;padding:.6em .8em;margin:.6em 0}
a{color:#1f5fbf}header a:focus,a:focus,button:focus,input:focus,select:focus,textarea:focus,
pre:focus,summary:focus{outline:2px solid #1f5fbf;outline-offset:2px}
.skip{position:absolute;left:-999px}.skip:focus{left:.5em;top:.5em;background:#fff;color:#1d2430;
padding:.3em}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:.2em 1em;background:#fff;
border:1px solid #e3e6ea;padding:.6em .8em}dl.facts dt{font-weight:600}dl.facts dd{margin:0}
.field{margin:.35em 0}.field label{display:inline-block;min-width:10em;font-weight:600}
.field small{display:block;margin-left:10.3em}fieldset.nested{padding:.3em .8em}
textarea{font:13px/1.4 ui-monospace,monospace;max-width:100%;box-sizing:border-box}
abbr.req{color:#b3261e;text-decoration:none}img.content{max-width:100%;height:auto}
#stderr{max-height:24em;min-height:4em}.error-box{border-color:#b3261e}
figure.chart{margin:.8em 0;background:#fff;border:1px solid #e3e6ea;padding:.5em}
svg.plot{width:100%;height:auto;display:block}.key{margin-left:1em;white-space:nowrap}
.message{border-left:3px solid #e3e6ea;padding-left:.6em;margin:.4em 0}
"""


def e(value: Any) -> str:
    return escape("" if value is None else str(value), quote=True)


def when(epoch: float | None) -> str:
    if not epoch:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch)) + " UTC"


def layout(title: str, body: str, *, csrf: str | None, active: str = "",
           script: str = "") -> str:
    nav = "".join(
        f'<a href="{href}" class="{"on" if name == active else ""}">{name}</a>'
        for name, href in NAV
    )
    logout = (f'<form method="post" action="/ui/logout"><input type="hidden" name="csrf" '
              f'value="{e(csrf)}"><button>log out</button></form>' if csrf else "")
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{e(title)} · "
            f"mcp-sidecar</title><meta name=viewport content='width=device-width'>"
            f"<style>{STYLE}</style></head><body><a class=skip href=#main>skip to the page"
            f"</a><header><strong>mcp-sidecar</strong><nav aria-label=console>{nav}</nav>"
            f"{logout}</header><main id=main><h1>{e(title)}</h1>{_focusable(body)}</main>"
            f"{script}"
            "</body></html>")


def _focusable(body: str) -> str:
    """Every `<pre>` may scroll (`max-height`), so each takes the keyboard's focus: a
    keyboard user can scroll it too."""
    return body.replace("<pre>", "<pre tabindex=0>").replace("<pre ", "<pre tabindex=0 ")


def login_page(error: str | None, provider: str | None = None) -> str:
    """The token form; with `[auth.oidc]`, a sign-in link to the identity provider above it."""
    message = f'<p class="bad">{e(error)}</p>' if error else ""
    if provider is not None:
        message += (f'<p class=card><a id=oidc-login href="/ui/login/oidc">Sign in with '
                    f"{e(provider)}</a></p>")
    body = (f"{message}<form method=post action=/ui/login class=card><label>Token "
            f"<input type=password name=token autocomplete=current-password autofocus "
            f"size=48></label> <button>log in</button><p class=muted>The bearer token is in "
            f"<code>&lt;state dir&gt;/token</code> or <code>$SIDECAR_TOKEN</code>.</p></form>")
    return layout("Log in", body, csrf=None)


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, empty: str) -> str:
    rows = list(rows)
    if not rows:
        return f'<p class="muted">{e(empty)}</p>'
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def state_class(state: str) -> str:
    return {"ready": "ok", "disabled": "muted", "starting": "warn"}.get(state, "bad")


def _sandbox(sandbox: Any) -> str:
    if not isinstance(sandbox, dict):
        return "no"
    network = sandbox.get("network")
    return "network " + (", ".join(network) if isinstance(network, list) else str(network))


def servers_page(health: Mapping[str, Any], csrf: str) -> str:
    status = health.get("status", "")
    rows = []
    for name, s in sorted(health.get("servers", {}).items()):
        action = ""
        if s.get("state") == "needs_auth":
            action = (f'<form class=inline method=post action="/ui/servers/{e(name)}/login">'
                      f'<input type=hidden name=csrf value="{e(csrf)}"><button>log in</button>'
                      f'</form> <span class=muted>or run <code>sidecar auth login {e(name)}'
                      f'</code></span>')
        rows.append([
            f'<strong><a href="/ui/servers/{e(quote(name, safe=""))}">{e(name)}</a></strong>',
            f'<span class="{state_class(str(s.get("state")))}">{e(s.get("state"))}</span>',
            e(s.get("transport")), e(s.get("protocol_version")), e(s.get("tool_count")),
            e(s.get("restarts")), e(_sandbox(s.get("sandbox"))), e(s.get("last_error")), action,
        ])
    servers = table(["server", "state", "transport", "era", "tools", "restarts", "sandbox",
                     "last error", ""], rows, empty="No MCP servers are configured.")
    problems = [*health.get("manifest_problems", []), *health.get("reload_problems", [])]
    listed = table(["file", "path", "problem"], (
        [e(p.get("file")), e(p.get("path")), e(p.get("message"))] for p in problems
    ), empty="No manifest problems.")
    store = health.get("store", {})
    return (f'<p>Status: <strong class="{"ok" if status == "ok" else "bad"}">{e(status)}'
            f'</strong> · managed store: {e(store.get("objects"))} objects, '
            f'{e(store.get("bytes"))} bytes</p>{servers}<h2>Manifest problems</h2>{listed}')


def tools_page(definitions: Sequence[Any], query: str, profiles: Sequence[str],
               profile: str, tokens: Mapping[str, int] | None = None,
               encoding: str = "") -> str:
    """`tokens`: each definition's tokens (`sidecar.serve.tool_tokens`), shown per card and
    in total."""
    options = "".join(
        f'<option value="{e(name)}"{" selected" if name == profile else ""}>'
        f'{"(all tools)" if name == "*" else e(name)}</option>'
        for name in profiles
    )
    chooser = (f' <label>profile <select name=profile>{options}</select></label>'
               if profiles else "")
    form = (f'<form method=get class=card><label>search <input name=q value="{e(query)}" '
            f'placeholder="names and descriptions" size=40></label>{chooser} '
            f'<button>search</button></form>')
    at = f"?{urlencode({'profile': profile})}" if profile else ""
    q = query.lower()
    shown = [d for d in definitions
             if not q or q in d.name.lower() or q in (d.description or "").lower()]
    tokens = tokens or {}

    def cost(name: str) -> str:
        n = tokens.get(name)
        return "" if n is None else f' <span class="muted tokens">{n:,} tokens</span>'

    cards = "".join(
        f'<div class=card><strong><a href="/ui/tools/{e(quote(d.name, safe=""))}{e(at)}">'
        f'{e(d.name)}</a></strong>{cost(d.name)} <span class=muted>'
        f'{e(d.title or "")}</span><p>{e(d.description)}</p><details><summary>input schema'
        f'</summary><pre>{e(json.dumps(d.input_schema, indent=2))}</pre></details></div>'
        for d in shown
    )
    total = ""
    if tokens:
        total = (f' · <span id=total-tokens>{sum(tokens.values()):,}</span> tokens of '
                 f'definitions ({e(encoding)}: name, description and input schema)')
    return f"{form}<p>{len(shown)} of {len(definitions)} tools{total}</p>{cards}"


def held_changes(changes: Sequence[Any], csrf: str) -> str:
    """Definition changes held by pinning, each with its diff and an approve button."""
    if not changes:
        return ""
    cards = "".join(
        f'<form method=post action="/ui/tools/{e(c.name)}/approve" class=card data-held='
        f'"{e(c.name)}"><input type=hidden name=csrf value="{e(csrf)}"><strong>{e(c.name)}'
        f'</strong> changed upstream ({e(c.action.replace("_", " "))}, policy {e(c.policy)})'
        f'<pre>{e(chr(10).join(c.diff))}</pre><button>approve the new definition</button>'
        f'</form>'
        for c in changes
    )
    return f"<h2>Definition changes waiting for approval</h2>{cards}<h2>Tools</h2>"


def asks_page(asks: Sequence[Any], csrf: str) -> str:
    if not asks:
        return '<p class="muted">No permission request is waiting.</p>'
    cards = []
    for ask in asks:
        r = ask.request
        cards.append(
            f'<form method=post action="/ui/asks/{e(ask.id)}" class=card data-ask="{e(ask.id)}">'
            f'<input type=hidden name=csrf value="{e(csrf)}"><p><strong>{e(r.action)}</strong>'
            f' asked by <code>{e(r.agent)}</code> in session <code>{e(r.session_id)}</code>'
            f' (call <code>{e(r.call_id)}</code>)</p>'
            f'<p class=muted>resources: {e(", ".join(r.resources) or "none")}</p>'
            f'<label>feedback <input name=feedback size=50></label> '
            f'<select name=scope><option value=session>this session</option>'
            f'<option value=location>every session</option></select> '
            f'<button name=reply value=once>allow once</button> '
            f'<button name=reply value=always>allow always</button> '
            f'<button name=reply value=reject>reject</button></form>'
        )
    return "".join(cards)


HISTORY_FILTERS = ("tool", "server", "status", "session", "agent", "user", "since", "until")


def calls_page(rows: Sequence[Any], filters: Mapping[str, str], next_cursor: str | None) -> str:
    inputs = "".join(
        f'<label>{name} <input name={name} value="{e(filters.get(name, ""))}" size=14></label> '
        for name in HISTORY_FILTERS
    )
    form = f"<form method=get class=card id=filters>{inputs}<button>filter</button></form>"
    live = ('<h2>Live</h2><table id=live><thead><tr><th>time</th><th>event</th><th>call</th>'
            '<th>tool</th><th>status</th></tr></thead><tbody></tbody></table>')
    body = history_table(rows)
    query = {k: v for k, v in filters.items() if v}
    more = (f'<p><a href="/ui/calls?{e(urlencode({**query, "cursor": next_cursor}))}">older '
            f"calls</a></p>" if next_cursor else "")
    export = f'<p><a href="/ui/calls.jsonl?{e(urlencode(query))}">export as JSON Lines</a></p>'
    return f"{live}<h2>History</h2>{form}{body}{more}{export}"


HISTORY_COLUMNS = ("started (UTC)", "call", "tool", "session", "agent", "status", "ms",
                   "bytes in/out", "retained", "input")
_COLUMN_CLASS = {"started (UTC)": "when", "call": "id", "tool": "name", "session": "id",
                 "agent": "short", "status": "status", "ms": "num", "bytes in/out": "num",
                 "input": "input"}
"""Columns kept from being squeezed by long ids and inputs (which wrap anywhere instead)."""


def history_table(rows: Sequence[Any]) -> str:
    """The history's rows; a failed call's error message on a row of its own below it."""
    if not rows:
        return '<p class="muted">No calls match.</p>'
    classes = [f" class={_COLUMN_CLASS[h]}" if h in _COLUMN_CLASS else ""
               for h in HISTORY_COLUMNS]
    head = "".join(f"<th{k}>{e(h)}</th>" for h, k in zip(HISTORY_COLUMNS, classes, strict=True))
    lines = []
    for r in rows:
        cells = "".join(f"<td{k}>{c}</td>"
                        for c, k in zip(history_row(r), classes, strict=True))
        if not r.error:
            lines.append(f"<tr>{cells}</tr>")
            continue
        lines.append(f"<tr class=failed>{cells}</tr><tr class=failure><td></td>"
                     f'<td colspan={len(HISTORY_COLUMNS) - 1} class="bad error">error: '
                     f"{e(r.error)}</td></tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(lines)}</tbody></table>"


def history_row(r: Any) -> list[str]:
    status = (f'<span class="{"ok" if r.status == "completed" else "bad"}">{e(r.status)}'
              f'{" " + e(r.error_kind) if r.error_kind else ""}'
              f'{" (replayed)" if r.replayed else ""}</span>')
    refs = " ".join(f'<a href="/ui/managed?ref={e(ref)}">{e(ref)}</a>' for ref in r.retained)
    shown = json.dumps(r.input, ensure_ascii=False)
    server = f'<span class=muted>{e(r.server)}/</span>' if r.server else ""
    day, moment = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.started_at)).split()
    link = "/ui/calls/" + quote(r.call_id, safe="") + "?" + urlencode(
        {"session": r.session_id, "at": int(r.started_at)})
    return [f"<span>{day}</span> <span>{moment}</span>",
            f'<a href="{e(link)}"><code>{e(r.call_id)}</code></a>',
            server + e(r.tool), e(r.session_id),
            e(r.agent) + (f' <span class=muted>({e(r.username)})</span>'
                          if getattr(r, "username", None) else ""),
            status, e(r.duration_ms),
            f"{e(r.input_bytes)} / {e(r.content_bytes)}",
            refs, f"<code>{e(_cut(shown, INPUT_SHOWN))}</code>"]


INPUT_SHOWN = 160
"""Characters of a call's input in its row (the export has all of it)."""


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


LIVE_SCRIPT = """<script>
const live = document.querySelector('#live tbody');
const source = new EventSource('/ui/events');
function row(kind, data) {
  const tr = document.createElement('tr');
  for (const v of [new Date().toISOString().slice(11, 19), kind, data.call_id || '',
                   data.tool || '',
                   [data.status || data.message || '', data.error_kind || ''].join(' ')]) {
    const td = document.createElement('td'); td.textContent = v; tr.appendChild(td);
  }
  live.prepend(tr);
  while (live.children.length > 50) live.lastChild.remove();
}
for (const kind of ['call.settled', 'call.progress', 'permission.asked']) {
  source.addEventListener(kind, (ev) => row(kind, JSON.parse(ev.data)));
}
</script>"""


ASKS_SCRIPT = """<script>
// reload when the set of asks changes: a new one, or one answered elsewhere
// (not while feedback is being typed)
const shown = () => new Set([...document.querySelectorAll('form[data-ask]')]
                            .map((f) => f.dataset.ask));
const asks = new EventSource('/ui/events');
function changed(present) {
  const typing = document.activeElement && document.activeElement.name === 'feedback';
  if (present !== undefined && !typing) location.reload();
}
asks.addEventListener('permission.asked', (ev) => {
  const id = JSON.parse(ev.data).ask.id;
  changed(shown().has(id) ? undefined : id);
});
asks.addEventListener('permission.replied', (ev) => {
  const id = JSON.parse(ev.data).ask_id;
  changed(shown().has(id) ? id : undefined);
});
</script>"""


def managed_page(params: Mapping[str, str], result: str, ref_info: str) -> str:
    def field(name: str, size: int = 10) -> str:
        return f'<label>{name} <input name={name} value="{e(params.get(name, ""))}" size={size}>'

    form = (f"<form method=get class=card>{field('ref', 34)}</label> {field('offset')}</label> "
            f"{field('limit', 6)}</label> {field('pattern', 20)}</label> "
            f"{field('start', 8)}</label> {field('length', 8)}</label> "
            f"<button>read</button><p class=muted>by lines: offset (first line) and limit; "
            f"inside a long line: offset (the line), start and length in characters; or a "
            f"pattern (RE2)</p></form>")
    ref = params.get("ref")
    download = (f'<p><a href="/ui/managed/{e(ref)}/download">download the whole text</a></p>'
                if ref else "")
    return f"{form}{ref_info}{download}{result}"
