"""Manifest tool entries (`[tools.NAME]` with `kind = "http"` or `kind = "command"`).

`validate_tool_entry(file, path, raw)` is the `tool_validator` for `bridges.manifest.loading`: it
turns
one raw entry (after `${env:VAR}` interpolation) into a frozen `HttpToolConfig` or
`CommandToolConfig`, or returns None with `ManifestProblem`s that name the JSON path of every
fault. `manifest_tool_validator(root)` does the same and also resolves `cwd` against the
Location root (so a symlink that leads outside is caught too). The key reference is in
`README.md` beside this module.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError

from bridges.manifest.guardrails import GuardrailsConfig
from bridges.manifest.sandbox import SandboxSetting
from bridges.manifest.values import BoundsConfig, ManifestProblem, did_you_mean, model_keys
from bridges.manifest_tools.shell_slots import place_slots
from bridges.manifest_tools.templates import Template, authority_end, quoted_slots
from sidecar.model.codec import make_codec
from sidecar.model.errors import SchemaDefinitionError
from sidecar.model.tool import Annotations, Bounds

KiB = 1024
MiB = 1024 * KiB

DEFAULT_MEMORY_CAP_BYTES = 4 * MiB
DEFAULT_MAX_RESPONSE_BYTES = 64 * MiB
DEFAULT_MAX_OUTPUT_BYTES = 256 * MiB
DEFAULT_HTTP_TIMEOUT = 30.0
DEFAULT_COMMAND_TIMEOUT = 60.0
DEFAULT_TERMINATE_GRACE = 2.0
MIN_MEMORY_CAP_BYTES = 64 * KiB

BASE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ",
            "TMPDIR")
"""Variables passed from the daemon to every command (when set); nothing else passes unless
named in `env_allow` or given in `env`."""

Decision = Literal["allow", "deny", "ask"]
Method = Literal["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
_NO_DEFAULT_BODY = frozenset({"GET", "HEAD", "OPTIONS"})
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_UNION_TAGS = frozenset({"str", "dict[str,str]", "list[str]", "none", "int", "float", "bool"})


def _names_as_mapping(value: Any) -> Any:
    """`["a", "b"]` is short for `{a = "a", b = "b"}` (the same name on both sides)."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return {v: v for v in value}
    return value


def _upper(value: Any) -> Any:
    return value.upper() if isinstance(value, str) else value


FieldMapping = Annotated[
    dict[str, str],
    BeforeValidator(_names_as_mapping, json_schema_input_type=dict[str, str] | list[str]),
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ToolAnnotations(_Strict):
    """MCP tool annotations, shown to clients as hints."""

    read_only: bool | None = None
    destructive: bool | None = None
    idempotent: bool | None = None
    open_world: bool | None = None


class _ToolBase(_Strict):
    description: Annotated[str, Field(min_length=1)]
    title: str | None = None
    namespace: str | None = None
    codemode: bool = True
    bounds: BoundsConfig = BoundsConfig()
    annotations: ToolAnnotations = ToolAnnotations()
    permission: Decision | None = None
    input: dict[str, Any]
    guardrails: GuardrailsConfig | None = None

    def tool_bounds(self) -> Bounds | None:
        if self.bounds.max_bytes is None and self.bounds.max_lines is None:
            return None
        return Bounds(self.bounds.max_bytes, self.bounds.max_lines)

    def tool_annotations(self, *, open_world: bool) -> Annotations:
        a = self.annotations
        return Annotations(
            title=self.title,
            read_only_hint=a.read_only,
            destructive_hint=a.destructive,
            idempotent_hint=a.idempotent,
            open_world_hint=a.open_world if a.open_world is not None else open_world,
        )


class HttpRequestConfig(_Strict):
    method: Annotated[Method, BeforeValidator(_upper)] = "GET"
    url: Annotated[str, Field(min_length=1)]
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    query: FieldMapping = Field(default_factory=dict)
    body: FieldMapping | str | None = None
    body_format: Literal["json", "form"] = "json"
    timeout: Annotated[float, Field(gt=0)] = DEFAULT_HTTP_TIMEOUT
    max_response_bytes: Annotated[int, Field(ge=1)] = DEFAULT_MAX_RESPONSE_BYTES
    memory_cap_bytes: Annotated[int, Field(ge=MIN_MEMORY_CAP_BYTES)] = DEFAULT_MEMORY_CAP_BYTES
    follow_redirects: bool = False

    @property
    def url_template(self) -> Template:
        return Template.parse(self.url)

    @property
    def header_templates(self) -> dict[str, Template]:
        return {name: Template.parse(value) for name, value in self.headers.items()}

    @property
    def sends_default_body(self) -> bool:
        return self.body is None and self.method not in _NO_DEFAULT_BODY


class HttpToolConfig(_ToolBase):
    kind: Literal["http"]
    output: dict[str, Any] | None = None
    request: HttpRequestConfig


class CommandToolConfig(_ToolBase):
    kind: Literal["command"]
    argv: list[str] | None = None
    shell: bool = False
    command: str | None = None
    cwd: str = "."
    env: dict[str, str] = Field(default_factory=dict, repr=False)
    env_allow: list[str] = Field(default_factory=list)
    stdin: str | None = None
    timeout: Annotated[float, Field(gt=0)] = DEFAULT_COMMAND_TIMEOUT
    terminate_grace: Annotated[float, Field(ge=0)] = DEFAULT_TERMINATE_GRACE
    success_codes: list[Annotated[int, Field(ge=0, le=255)]] = Field(
        default_factory=lambda: [0], min_length=1
    )
    output: Literal["text", "json"] = "text"
    output_schema: dict[str, Any] | None = None
    progress: bool = False
    memory_cap_bytes: Annotated[int, Field(ge=MIN_MEMORY_CAP_BYTES)] = DEFAULT_MEMORY_CAP_BYTES
    max_output_bytes: Annotated[int, Field(ge=1)] = DEFAULT_MAX_OUTPUT_BYTES
    sandbox: SandboxSetting = None

    @property
    def argv_templates(self) -> tuple[Template, ...]:
        return tuple(Template.parse(element) for element in self.argv or ())

    @property
    def program(self) -> str:
        """What the command runs, as a permission resource: argv[0] or the shell."""
        return self.argv[0] if self.argv else "/bin/sh"


ManifestToolConfig = HttpToolConfig | CommandToolConfig
_ENTRY = TypeAdapter(Annotated[ManifestToolConfig, Field(discriminator="kind")])
ToolValidator = Callable[[str, str, Any], tuple[ManifestToolConfig | None, list[ManifestProblem]]]
_MODELS: dict[str, type[HttpToolConfig] | type[CommandToolConfig]] = {
    "http": HttpToolConfig,
    "command": CommandToolConfig,
}


def tool_entry_json_schema() -> dict[str, Any]:
    """The JSON Schema of one `tools` entry (for schema/manifest.schema.json)."""
    schema = _ENTRY.json_schema()
    schema["title"] = "mcp-sidecar manifest tool (kind = http | command)"
    return schema


def validate_tool_entry(
    file: str, path: str, raw: Any
) -> tuple[ManifestToolConfig | None, list[ManifestProblem]]:
    """Validate one `tools` entry; usable as `load_manifests(..., tool_validator=...)`."""
    return _validate(file, path, raw, root=None)


def manifest_tool_validator(root: str | os.PathLike[str]) -> ToolValidator:
    """`validate_tool_entry` that also checks `cwd` against the resolved Location `root`."""
    resolved = Path(root).resolve()

    def validate(
        file: str, path: str, raw: Any
    ) -> tuple[ManifestToolConfig | None, list[ManifestProblem]]:
        return _validate(file, path, raw, root=resolved)

    return validate


def _validate(
    file: str, path: str, raw: Any, *, root: Path | None
) -> tuple[ManifestToolConfig | None, list[ManifestProblem]]:
    report = _Report(file)
    if not isinstance(raw, dict):
        report.error(path, f"a tool entry must be an object/table, got {type(raw).__name__}")
        return None, report.problems
    kind = raw.get("kind")
    model = _MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        message = "kind is missing" if kind is None else f"{kind!r} is not a manifest tool kind"
        suggestion = did_you_mean(kind, _MODELS) if isinstance(kind, str) else ""
        report.error(f"{path}.kind", message,
                     suggestion or 'write kind = "http" or kind = "command"')
        return None, report.problems
    try:
        config = model.model_validate(raw)
    except ValidationError as exc:
        report.pydantic(path, exc, f"see the {kind} keys in bridges/manifest_tools/README.md",
                        known=model_keys(model))
        return None, report.problems
    properties = _check_schemas(config, path, report)
    if properties is None:  # placeholders cannot be checked against an unusable schema
        return None, report.problems
    if isinstance(config, HttpToolConfig):
        _check_http(config, path, properties, report)
    else:
        _check_command(config, path, properties, report, root)
    return (None if report.failed else config), report.problems


class _Report:
    def __init__(self, file: str) -> None:
        self.file = file
        self.problems: list[ManifestProblem] = []

    @property
    def failed(self) -> bool:
        return any(p.severity == "error" for p in self.problems)

    def error(self, path: str, message: str, hint: str = "", *, unknown_key: bool = False) -> None:
        self.problems.append(ManifestProblem(self.file, path, message, hint,
                                             unknown_key=unknown_key))

    def pydantic(
        self, base: str, exc: ValidationError, hint: str, *, known: Iterable[str] = ()
    ) -> None:
        grouped: dict[str, list[str]] = {}
        hints: dict[str, str] = {}
        for err in exc.errors(include_url=False):
            loc = [p for p in err["loc"] if not _is_union_tag(p)]
            path = _json_path(base, loc)
            messages = grouped.setdefault(path, [])
            message = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                message = "unknown key"
                if loc and (suggestion := did_you_mean(str(loc[-1]), known)):
                    hints[path] = suggestion
            if message not in messages:
                messages.append(message)
        for path, messages in grouped.items():
            self.error(path, " or ".join(messages), hints.get(path, hint),
                       unknown_key="unknown key" in messages)

    def unknown_field(self, path: str, what: str, name: str, properties: Iterable[str]) -> None:
        known = ", ".join(sorted(properties)) or "(none)"
        self.error(path, f"{what} {name!r} is not a property of the input schema",
                   f"input properties: {known}")


def _is_union_tag(part: Any) -> bool:
    return isinstance(part, str) and (
        part.replace(" ", "") in _UNION_TAGS or part.startswith("function-")
    )


def _json_path(base: str, loc: Iterable[Any]) -> str:
    path = base
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", str(part)):
            path += f".{part}"
        else:
            path += f'["{part}"]'
    return path


def _schema_problem(path: str, what: str, schema: Mapping[str, Any], report: _Report) -> bool:
    try:
        make_codec(schema)
    except SchemaDefinitionError as exc:
        report.error(path + exc.path.removeprefix("$"), f"{what} is not a valid JSON Schema: "
                     f"{exc.message}")
        return True
    return False


def _check_schemas(
    config: ManifestToolConfig, path: str, report: _Report
) -> dict[str, Any] | None:
    """Check input/output schemas; return the input's properties, or None if it is unusable."""
    output = config.output if isinstance(config, HttpToolConfig) else config.output_schema
    key = "output" if isinstance(config, HttpToolConfig) else "output_schema"
    if output is not None:
        _schema_problem(f"{path}.{key}", key, output, report)
    schema = config.input
    if _schema_problem(f"{path}.input", "input", schema, report):
        return None
    if schema.get("type") != "object":
        report.error(f"{path}.input.type", "the input schema must describe an object",
                     'write type = "object" with the fields under properties')
        return None
    properties = schema.get("properties", {})
    return properties if isinstance(properties, dict) else {}


def _required(config: ManifestToolConfig) -> set[str]:
    required = config.input.get("required", [])
    return {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()


def _check_http(
    config: HttpToolConfig, path: str, properties: Mapping[str, Any], report: _Report
) -> None:
    request = config.request
    base = f"{path}.request"
    template = request.url_template
    scheme = template.literal_prefix().split("://", 1)[0].lower()
    if "://" not in template.literal_prefix() or scheme not in ("http", "https"):
        report.error(f"{base}.url", "the URL must start with http:// or https://",
                     "the scheme and host cannot come from the input")
    else:
        head = Template.parse(request.url[: authority_end(request.url)])
        if head.fields:
            report.error(f"{base}.url", f"placeholder {{{head.fields[0]}}} is in the host part",
                         "placeholders may appear only in the path and the query")
    required = _required(config)
    for name in template.fields:
        if name not in properties:
            report.unknown_field(f"{base}.url", "URL placeholder", "{" + name + "}", properties)
        elif name not in required:
            report.error(f"{base}.url", f"URL placeholder {{{name}}} refers to an optional "
                         "field", f'add "{name}" to input.required')
    for header, value in request.headers.items():
        if not _HEADER_NAME.fullmatch(header):
            report.error(_json_path(f"{base}.headers", [header]), "not a valid header name")
        for name in Template.parse(value).fields:
            if name not in properties:
                report.unknown_field(_json_path(f"{base}.headers", [header]),
                                     "header placeholder", "{" + name + "}", properties)
    for param, name in request.query.items():
        if name not in properties:
            report.unknown_field(_json_path(f"{base}.query", [param]), "query field", name,
                                 properties)
    _check_body(request, base, properties, report)


def _check_body(
    request: HttpRequestConfig, base: str, properties: Mapping[str, Any], report: _Report
) -> None:
    body = request.body
    if body is None:
        return
    if request.method in ("GET", "HEAD") and body:
        report.error(f"{base}.body", f"a {request.method} request carries no body",
                     "use query to send input fields as URL parameters")
    if isinstance(body, str):
        if body not in properties:
            report.unknown_field(f"{base}.body", "body field", body, properties)
        if request.body_format == "form":
            report.error(f"{base}.body", "a form body needs a mapping of form keys to fields",
                         'write body = { key = "field" } or body = ["field", ...]')
        return
    for key, name in body.items():
        if name not in properties:
            report.unknown_field(_json_path(f"{base}.body", [key]), "body field", name,
                                 properties)


def _check_command(
    config: CommandToolConfig,
    path: str,
    properties: Mapping[str, Any],
    report: _Report,
    root: Path | None,
) -> None:
    _check_program(config, path, properties, report)
    _check_cwd(config.cwd, f"{path}.cwd", report, root)
    for name in config.env:
        if not _ENV_NAME.fullmatch(name):
            report.error(_json_path(f"{path}.env", [name]), "not a valid variable name")
    for i, name in enumerate(config.env_allow):
        if not _ENV_NAME.fullmatch(name):
            report.error(f"{path}.env_allow[{i}]", f"{name!r} is not a valid variable name")
    if config.stdin is not None and config.stdin not in properties:
        report.unknown_field(f"{path}.stdin", "stdin field", config.stdin, properties)
    if config.output_schema is not None and config.output != "json":
        report.error(f"{path}.output_schema", "output_schema needs output = \"json\"",
                     "a text command has no machine output to validate")


def _check_program(
    config: CommandToolConfig, path: str, properties: Mapping[str, Any], report: _Report
) -> None:
    if config.argv is not None and config.command is not None:
        report.error(path, "give either argv or command, not both",
                     "argv runs a program directly; command runs through /bin/sh")
        return
    if config.command is not None:
        if not config.shell:
            report.error(f"{path}.command", "command runs through a shell, which must be "
                         "asked for explicitly", "set shell = true, or write argv as a list")
            return
        template = Template.parse(config.command)
        for name in template.fields:
            if name not in properties:
                report.unknown_field(f"{path}.command", "placeholder", "{" + name + "}",
                                     properties)
        for name in quoted_slots(template):
            report.error(f"{path}.command", f"placeholder {{{name}}} stands inside quotes",
                         "write it unquoted: its value reaches the shell as one word")
        for problem in place_slots(template).problems:
            report.error(f"{path}.command", problem,
                         "values reach the shell as positional parameters (\"${1}\"), never "
                         "as script text; this place cannot take one")
        return
    if config.shell:
        report.error(f"{path}.shell", "shell = true needs command (a string)",
                     "or drop shell and write argv as a list")
        return
    if not config.argv:
        report.error(f"{path}.argv" if config.argv is not None else path,
                     "a command tool needs argv (a non-empty list)",
                     'for example argv = ["git", "log", "-n", "{count}"]')
        return
    for i, template in enumerate(config.argv_templates):
        if i == 0 and template.fields:
            report.error(f"{path}.argv[0]", "the program cannot come from the input",
                         "name the program literally; pass input as later arguments")
        for name in template.fields:
            if name not in properties:
                report.unknown_field(f"{path}.argv[{i}]", "placeholder", "{" + name + "}",
                                     properties)


def _check_cwd(cwd: str, path: str, report: _Report, root: Path | None) -> None:
    if os.path.isabs(cwd) or cwd.startswith("~"):
        report.error(path, f"cwd {cwd!r} must be relative to the Location root",
                     'write a path inside the root, e.g. "." or "src"')
        return
    normal = posixpath.normpath(cwd.replace(os.sep, "/"))
    if normal == ".." or normal.startswith("../"):
        report.error(path, f"cwd {cwd!r} escapes the Location root",
                     "a command runs inside the Location root or below it")
        return
    if root is not None and not (root / cwd).resolve().is_relative_to(root):
        report.error(path, f"cwd {cwd!r} resolves outside the Location root (a symlink?)",
                     "a command runs inside the Location root or below it")


def resolve_cwd(root: Path, cwd: str) -> Path:
    """`cwd` under `root` with symlinks resolved; ValueError if it leaves `root`."""
    resolved = (root / cwd).resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise ValueError(f"cwd {cwd!r} resolves outside the Location root")
    return resolved
