"""`command` manifest tools: one process group per call, no shell unless asked for.

    input -> argv (one element = one argument; or, with `shell = true`, `/bin/sh -c SCRIPT sh
    VALUE...`: the values are positional parameters, never part of the script)
    -> cwd inside the Location root -> env (basics + env_allow + env)
    -> permission ask -> run (see `process`) -> exit code in success_codes?
       yes: text content (stdout, then stderr) or JSON output
       no:  tool_failure with the exit code and the stderr tail; timeout: `timeout`

stdout and stderr are captured separately (see `capture`), each with `memory_cap_bytes` in
memory, then spooled to the managed store, and `max_output_bytes` kept at most: past it the
pipe is still drained and the result says exactly how many bytes were discarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import json
import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bridges.manifest.sandbox import with_default
from bridges.manifest_tools.capture import Captured, OutputCapture
from bridges.manifest_tools.config import BASE_ENV, CommandToolConfig, resolve_cwd
from bridges.manifest_tools.process import Exited, ProcessSpec, spawn, supervise
from bridges.manifest_tools.progress import LineProgress
from bridges.manifest_tools.redaction import Redactor
from bridges.manifest_tools.shell_slots import place_slots, render_shell
from bridges.manifest_tools.templates import (
    RenderError,
    Template,
    render_argv,
    value_text,
)
from bridges.sandbox import explain_exit, sandboxed
from managed_store import TextStore
from sidecar.model.content import ContentItem, TextContent
from sidecar.model.errors import ErrorKind, ToolFailure
from sidecar.model.permissions import PermissionGate, ask_permission
from sidecar.model.tool import CallContext, Tool, ToolResponse

SHELL = "/bin/sh"

# errnos of spawning that describe the daemon's own resources, not the command
_DAEMON_OUT_OF = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN})


def command_tool(
    config: CommandToolConfig,
    *,
    store: TextStore,
    store_namespace: str,
    root: Path,
    permissions: PermissionGate | None,
) -> Tool:
    call = CommandCall(config, store, store_namespace, root, permissions)
    json_output = config.output == "json" and config.output_schema is not None
    return Tool(
        description=config.description,
        input=config.input,
        output=config.output_schema if json_output else None,
        execute=call,
        title=config.title,
        namespace=config.namespace,
        codemode=config.codemode,
        annotations=config.tool_annotations(open_world=False),
        bounds=config.tool_bounds(),
    )


def command_env(config: CommandToolConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """The child's whole environment: `BASE_ENV` and `env_allow` from `environ`, then `env`."""
    env = {name: environ[name] for name in (*BASE_ENV, *config.env_allow) if name in environ}
    env.update(config.env)
    return env


class CommandCall:
    """The `execute` of one command tool value."""

    def __init__(
        self,
        config: CommandToolConfig,
        store: TextStore,
        store_namespace: str,
        root: Path,
        permissions: PermissionGate | None,
    ) -> None:
        self._config = config
        self._store = store
        self._namespace = store_namespace
        self._root = root
        self._permissions = permissions
        self._argv = config.argv_templates
        self._shell = Template.parse(config.command) if config.command is not None else None
        self._placement = place_slots(self._shell) if self._shell is not None else None
        self._sandbox = with_default(config.sandbox, None)

    async def __call__(self, args: dict[str, Any], ctx: CallContext) -> ToolResponse:
        config = self._config
        tool = ctx.tool_name
        argv = self._render(args, tool)
        try:  # symlinks may have changed since the manifest was loaded: resolve again
            cwd = await asyncio.to_thread(_working_dir, self._root, config.cwd)
        except ValueError as exc:
            raise ToolFailure(f"{tool}: {exc}") from None
        env = command_env(config, os.environ)
        redact = Redactor([*config.env.values(), *(env.get(n, "") for n in config.env_allow)])
        await ask_permission(
            self._permissions, ctx, resources=(config.program,),
            metadata={"kind": "command", "argv": _shown(argv), "cwd": config.cwd},
            default=config.permission,
        )
        spec = ProcessSpec(
            argv=tuple(argv),
            cwd=cwd,
            env=env,
            stdin=self._stdin(args),
            timeout=config.timeout,
            terminate_grace=config.terminate_grace,
        )
        progress = LineProgress(ctx.progress) if config.progress else None
        owner = ctx.store_owner
        async with (
            self._capture(owner) as out, self._capture(owner) as err,
            contextlib.AsyncExitStack() as sandbox,  # an allow-list's egress proxy lives here
        ):
            ran: list[str] = []  # what ran: its sandbox's cgroup counters (`explain_exit`)
            try:
                if self._sandbox is not None:  # bwrap's argv (`bridges.sandbox`)
                    ran = await sandbox.enter_async_context(sandboxed(
                        self._sandbox, argv, cwd=cwd, env=self._sandbox_env(env),
                        name=tool, entry=f"tool:{tool}"))
                    spec = dataclasses.replace(spec, argv=tuple(ran))
                running = await spawn(spec)
            except OSError as exc:
                if exc.errno in _DAEMON_OUT_OF:
                    # The daemon ran out of descriptors, processes or memory: a defect of the
                    # daemon's state (operational), not something the tool did.
                    raise
                reason = exc.strerror or str(exc)
                raise ToolFailure(f"{tool}: cannot start {argv[0]!r}: {reason}") from None
            exited = await supervise(running, spec, out, err, progress)
            if progress is not None:
                progress.close()
            stdout = await out.finish()
            stderr = await err.finish()
        return self._result(tool, exited, stdout, stderr, redact, ran)

    def _sandbox_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """What a sandboxed command gets of its environment besides its sandbox's `env`: what
        its entry sets or allows by name, not the basics every command gets (`BASE_ENV`)."""
        allowed = {name: env[name] for name in self._config.env_allow if name in env}
        return allowed | dict(self._config.env)

    def _render(self, args: dict[str, Any], tool: str) -> list[str]:
        try:
            if self._shell is not None:
                script, values = render_shell(self._shell, args, self._placement)
                return [SHELL, "-c", script, "sh", *values]
            return render_argv(self._argv, args)
        except RenderError as exc:
            raise ToolFailure(f"{tool}: {exc}") from None

    def _stdin(self, args: dict[str, Any]) -> bytes | None:
        field = self._config.stdin
        if field is None or args.get(field) is None:
            return None
        return value_text(args[field]).encode("utf-8", "surrogatepass")

    def _capture(self, owner: str) -> OutputCapture:
        return OutputCapture(
            self._store,
            namespace=self._namespace,
            owner=owner,
            memory_cap=self._config.memory_cap_bytes,
            hard_cap=self._config.max_output_bytes,
        )

    # --- the result -------------------------------------------------------------------------

    def _result(
        self, tool: str, exited: Exited, stdout: Captured, stderr: Captured, redact: Redactor,
        ran: Sequence[str] = (),
    ) -> ToolResponse:
        config = self._config
        meta: dict[str, Any] = {"exit_code": exited.returncode}
        for name, captured in (("stdout", stdout), ("stderr", stderr)):
            summary = _summary(captured)
            if summary:
                meta[name] = summary
        program = self._argv[0].source if self._argv else SHELL
        if exited.timed_out:
            ran = f"{tool}: {program} timed out after {config.timeout:g} s"
            if exited.returncode is not None:
                ran = (f"{tool}: {program} exited with code {exited.returncode}, but processes "
                       f"it started kept its output open until the timeout ({config.timeout:g} s)")
            raise ToolFailure(
                redact(ran + "; its process group was terminated" + _tails(stdout, stderr)),
                metadata=meta,
                kind=ErrorKind.TIMEOUT,
            )
        code = exited.returncode
        assert code is not None
        if code not in config.success_codes:
            codes = ", ".join(map(str, config.success_codes))
            how = (f"was killed by signal {_signal_name(-code)}" if code < 0
                   else f"exited with code {code} (success codes: {codes})")
            why = (explain_exit(self._sandbox, code, stderr.tail_excerpt(), ran)
                   if self._sandbox is not None else None)
            how += f"; {why}" if why else ""
            raise ToolFailure(redact(f"{tool}: {program} {how}" + _tails(stdout, stderr)),
                              metadata=meta)
        if config.output == "json":
            return self._json(tool, stdout, meta)
        return ToolResponse(content=self._text(code, stdout, stderr), metadata=meta)

    def _json(self, tool: str, stdout: Captured, meta: dict[str, Any]) -> ToolResponse:
        if stdout.text is None or stdout.dropped_bytes:
            limit = "max_output_bytes" if stdout.dropped_bytes else "memory_cap_bytes"
            raise ToolFailure(
                f"{tool}: stdout ({stdout.kept_bytes + stdout.dropped_bytes:,} bytes) is larger "
                f"than {limit} and cannot be parsed as JSON; raise {limit}",
                metadata=meta,
            )
        try:
            value = json.loads(stdout.text)
        except ValueError as exc:
            raise ToolFailure(
                f"{tool}: stdout is not JSON ({exc}): {stdout.text[:300]!r}", metadata=meta
            ) from None
        if self._config.output_schema is not None:
            return ToolResponse(output=value, metadata=meta)
        return ToolResponse(content=stdout.text, metadata=meta)

    def _text(self, code: int, stdout: Captured, stderr: Captured) -> list[ContentItem]:
        items: list[ContentItem] = []
        notes = [f"[exit code {code}]"] if code != 0 else []
        if not stdout.empty or stderr.empty:
            notes.extend(_notes("stdout", stdout, self._config.max_output_bytes))
            body = stdout.preview("stdout")
            items.append(TextContent("\n".join([*notes, body]) if notes else body or
                                     "[no output]"))
            notes = []
        if not stderr.empty:
            notes.extend(_notes("stderr", stderr, self._config.max_output_bytes))
            items.append(TextContent("\n".join(["[stderr]", *notes, stderr.preview("stderr")])))
        return items


def _notes(label: str, captured: Captured, limit: int) -> list[str]:
    notes = []
    if captured.dropped_bytes:
        notes.append(
            f"[{label} reached max_output_bytes = {limit:,}: the last "
            f"{captured.dropped_bytes:,} of its {captured.kept_bytes + captured.dropped_bytes:,} "
            "bytes were discarded (not kept)]"
        )
    if captured.replaced:
        notes.append(f"[{label} is not valid UTF-8: invalid bytes were replaced with U+FFFD]")
    return notes


def _summary(captured: Captured) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    if captured.ref is not None:
        summary.update(ref=captured.ref.id, size_bytes=captured.ref.size_bytes,
                       lines=captured.ref.lines)
    if captured.dropped_bytes:
        summary.update(kept_bytes=captured.kept_bytes, dropped_bytes=captured.dropped_bytes)
    if captured.replaced:
        summary["replaced_invalid_bytes"] = True
    return summary


def _tails(stdout: Captured, stderr: Captured) -> str:
    """The stderr tail for an error message, or the stdout tail when stderr is empty."""
    for label, captured in (("stderr", stderr), ("stdout", stdout)):
        excerpt = captured.tail_excerpt()
        if excerpt.strip():
            return f"; {label} (last lines):\n{excerpt}"
    return "; it wrote nothing to stdout or stderr"


def _shown(argv: list[str], max_args: int = 50, max_chars: int = 200) -> list[str]:
    """argv for a permission prompt: long arguments cut, many arguments summarized."""
    shown = [a if len(a) <= max_chars else a[:max_chars] + "..." for a in argv[:max_args]]
    if len(argv) > max_args:
        shown.append(f"... and {len(argv) - max_args} more arguments")
    return shown


def _working_dir(root: Path, cwd: str) -> Path:
    resolved = resolve_cwd(root, cwd)
    if not resolved.is_dir():
        raise ValueError(f"cwd {cwd!r} is not a directory under the Location root")
    return resolved


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
