"""Manifest tool entries: what loads, and every fault as a problem with its exact JSON path."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from bridges.manifest.loading import load_manifests
from bridges.manifest_tools import (
    CommandToolConfig,
    HttpRequestConfig,
    HttpToolConfig,
    manifest_tool_validator,
    tool_entry_json_schema,
    validate_tool_entry,
)
from bridges.manifest_tools.shell_slots import render_shell
from bridges.manifest_tools.templates import Template, render_argv, render_url

README = Path(__file__).resolve().parents[2] / "bridges" / "manifest_tools" / "README.md"
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def http(**request: Any) -> dict[str, Any]:
    return {
        "kind": "http",
        "description": "d",
        "input": CITY,
        "request": {"url": "http://127.0.0.1:9/w?city={city}", **request},
    }


def command(**keys: Any) -> dict[str, Any]:
    return {"kind": "command", "description": "d", "input": CITY, "argv": ["echo", "{city}"],
            **keys}


def problems_of(raw: Any, root: Path | None = None) -> list[tuple[str, str, str]]:
    validate = validate_tool_entry if root is None else manifest_tool_validator(root)
    config, problems = validate("m.toml", "$.tools.t", raw)
    assert (config is None) == any(p.severity == "error" for p in problems)
    return [(p.path, p.message, p.hint) for p in problems]


def only_problem(raw: Any, root: Path | None = None) -> tuple[str, str, str]:
    found = problems_of(raw, root)
    assert len(found) == 1, found
    return found[0]


def test_the_design_example_loads_through_load_manifests(tmp_path):
    (tmp_path / "main.toml").write_text(
        '[tools.weather]\nkind = "http"\ndescription = "Current weather for a city"\n'
        'input = { type = "object", properties = { city = { type = "string" } }, '
        'required = ["city"] }\n'
        'request = { method = "GET", url = "http://127.0.0.1:9001/weather?city={city}" }\n'
    )
    loaded = load_manifests([tmp_path], tool_validator=validate_tool_entry)
    assert loaded.errors == []
    config = loaded.tools["weather"].value
    assert isinstance(config, HttpToolConfig)
    assert config.request.method == "GET" and config.request.follow_redirects is False


def test_every_key_of_both_kinds_loads_from_toml(tmp_path):
    (tmp_path / "tools.toml").write_text("""
[tools.search]
kind = "http"
description = "Search"
title = "Search the index"
namespace = "idx"
codemode = false
permission = "ask"
bounds = { max_bytes = 4096, max_lines = 100 }
annotations = { read_only = true }
input = { type = "object", properties = { q = { type = "string" }, n = { type = "integer" }, \
id = { type = "string" } }, required = ["q", "id"] }
output = { type = "object" }
[tools.search.request]
method = "post"
url = "https://api.example.test/v1/{id}/search"
headers = { Authorization = "Bearer ${env:TOKEN}", X-Trace = "{id}" }
query = ["q"]
body = { limit = "n" }
timeout = 5
max_response_bytes = 1000000
memory_cap_bytes = 65536
follow_redirects = true

[tools.grep]
kind = "command"
description = "grep"
input = { type = "object", properties = { pattern = { type = "string" }, \
text = { type = "string" } } }
argv = ["grep", "-n", "--", "{pattern}"]
cwd = "src"
env = { LC_ALL = "C" }
env_allow = ["GREP_COLORS"]
stdin = "text"
timeout = 10
terminate_grace = 0.5
success_codes = [0, 1]
output = "json"
output_schema = { type = "object" }
progress = true
memory_cap_bytes = 65536
max_output_bytes = 1048576
""")
    loaded = load_manifests([tmp_path], environ={"TOKEN": "tok"},
                            tool_validator=manifest_tool_validator(tmp_path))
    assert loaded.problems == []
    search = loaded.tools["search"].value
    assert search.request.method == "POST" and search.request.query == {"q": "q"}
    assert search.request.headers["Authorization"] == "Bearer tok"
    assert search.tool_bounds() is not None and search.tool_annotations(open_world=True) \
        .read_only_hint is True
    grep = loaded.tools["grep"].value
    assert isinstance(grep, CommandToolConfig) and grep.success_codes == [0, 1]


def test_secrets_in_headers_and_env_never_show_in_a_repr():
    config, _ = validate_tool_entry("m", "$.tools.t", http(headers={"X-Key": "hunter2-secret"}))
    assert config is not None and "hunter2-secret" not in repr(config)
    config, _ = validate_tool_entry("m", "$.tools.t", command(env={"TOKEN": "hunter2-secret"}))
    assert config is not None and "hunter2-secret" not in repr(config)


def test_a_bad_entry_does_not_stop_the_good_ones(tmp_path):
    (tmp_path / "a.json").write_text(
        '{"tools": {"bad": {"kind": "ftp", "description": "x", "input": {}},'
        ' "good": {"kind": "command", "description": "x", "input": {"type": "object"},'
        ' "argv": ["true"]}}}'
    )
    loaded = load_manifests([tmp_path], tool_validator=validate_tool_entry)
    assert list(loaded.tools) == ["good"]
    [problem] = loaded.errors
    assert problem.path == "$.tools.bad.kind" and "'ftp'" in problem.message
    assert str(problem).startswith(str(tmp_path / "a.json"))


@pytest.mark.parametrize(
    ("raw", "path", "message"),
    [
        ([], "$.tools.t", "must be an object"),
        ({"description": "d"}, "$.tools.t.kind", "missing"),
        (http(bogus=1), "$.tools.t.request.bogus", "unknown key"),
        (http(timeout=-1), "$.tools.t.request.timeout", "greater than 0"),
        (http(method="BREW"), "$.tools.t.request.method", "'GET'"),
        (http(body=5), "$.tools.t.request.body", "dictionary or"),
        ({**http(), "input": {"type": "array"}}, "$.tools.t.input.type", "describe an object"),
        ({**http(), "input": {"type": "object", "properties": {"a": {"type": "nope"}}}},
         "$.tools.t.input.properties.a.type", "not a valid JSON Schema"),
        ({**http(), "output": {"type": 5}}, "$.tools.t.output.type", "not a valid JSON Schema"),
        (http(url="ftp://127.0.0.1/{city}"), "$.tools.t.request.url", "http:// or https://"),
        (http(url="http://{city}.example.test/"), "$.tools.t.request.url", "host part"),
        (http(query={"q": "town"}), "$.tools.t.request.query.q", "'town' is not a property"),
        (http(headers={"X-A": "{town}"}), "$.tools.t.request.headers.X-A", "{town}"),
        (http(headers={"bad header": "v"}), '$.tools.t.request.headers["bad header"]',
         "header name"),
        (http(method="PUT", body={"k": "town"}), "$.tools.t.request.body.k", "'town'"),
        (http(body=["city"]), "$.tools.t.request.body", "GET request carries no body"),
        (http(method="POST", body="city", body_format="form"), "$.tools.t.request.body",
         "form body"),
        (command(argv=[]), "$.tools.t.argv", "non-empty"),
        (command(command="ls"), "$.tools.t", "not both"),
        ({**command(), "argv": None, "command": "ls"}, "$.tools.t.command", "explicitly"),
        (command(argv=None, shell=True), "$.tools.t.shell", "needs command"),
        (command(argv=["{city}"]), "$.tools.t.argv[0]", "cannot come from the input"),
        (command(argv=["echo", "x", "--town={town}"]), "$.tools.t.argv[2]", "{town}"),
        (command(argv=None, shell=True, command="echo '{city}'"), "$.tools.t.command",
         "inside quotes"),
        (command(argv=None, shell=True, command='echo "x {city}"'), "$.tools.t.command",
         "inside quotes"),
        (command(cwd="../elsewhere"), "$.tools.t.cwd", "escapes the Location root"),
        (command(cwd="a/../../b"), "$.tools.t.cwd", "escapes the Location root"),
        (command(cwd="/etc"), "$.tools.t.cwd", "relative to the Location root"),
        (command(stdin="body"), "$.tools.t.stdin", "'body' is not a property"),
        (command(success_codes=[]), "$.tools.t.success_codes", "at least 1"),
        (command(success_codes=[0, 300]), "$.tools.t.success_codes[1]", "less than or equal"),
        (command(output_schema={"type": "object"}), "$.tools.t.output_schema",
         'output = "json"'),
        (command(env={"BAD NAME": "1"}), '$.tools.t.env["BAD NAME"]', "variable name"),
        (command(env_allow=["OK", "1BAD"]), "$.tools.t.env_allow[1]", "variable name"),
        (command(memory_cap_bytes=10), "$.tools.t.memory_cap_bytes", "greater than or equal"),
    ],
)
def test_each_fault_is_one_problem_at_its_json_path(raw, path, message):
    found_path, found_message, _ = only_problem(raw)
    assert found_path == path
    assert message in found_message


def test_an_unknown_placeholder_is_named_with_a_hint_listing_the_properties():
    path, message, hint = only_problem(http(url="http://127.0.0.1:9/w/{town}?c={city}"))
    assert path == "$.tools.t.request.url"
    assert message == "URL placeholder '{town}' is not a property of the input schema"
    assert hint == "input properties: city"


def test_a_url_placeholder_must_be_a_required_field():
    raw = http(url="http://127.0.0.1:9/w/{n}")
    raw["input"] = {"type": "object", "properties": {"n": {"type": "string"}}}
    _, message, hint = only_problem(raw)
    assert "{n} refers to an optional field" in message and '"n"' in hint


def test_a_cwd_that_leaves_the_root_through_a_symlink_is_caught_with_the_root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "out").symlink_to(tmp_path)
    assert problems_of(command(cwd="out")) == []  # lexically fine
    path, message, _ = only_problem(command(cwd="out"), root)
    assert path == "$.tools.t.cwd" and "resolves outside" in message
    assert problems_of(command(cwd="inside/deeper"), root) == []


def test_templates_escape_what_each_target_needs():
    url = Template.parse("http://h/x/{a}?q={b}&lit={{b}}")
    rendered = render_url(url, {"a": "../etc/passwd", "b": "x&y=z#f %"})
    assert rendered == "http://h/x/..%2Fetc%2Fpasswd?q=x%26y%3Dz%23f%20%25&lit={b}"
    assert render_url(Template.parse("http://h/{a}"), {"a": ".."}) == "http://h/%2E%2E"
    argv = tuple(Template.parse(t) for t in ["prog", "{a}", "--n={n}", "{files}", "{opt}"])
    assert render_argv(argv, {"a": "$(x) `y`", "n": 3, "files": ["a b", "c"]}) == [
        "prog", "$(x) `y`", "--n=3", "a b", "c"
    ]
    shell = Template.parse("printf '%s|' {a} {b}; awk '{print $1}'")
    assert render_shell(shell, {"a": "$(touch p)", "b": "it's"}) == (
        "printf '%s|' \"${1}\" \"${2}\"; awk '{print $1}'", ["$(touch p)", "it's"]
    )


def test_the_readme_example_loads_and_fits_the_published_json_schema(tmp_path):
    example = re.search(r"```toml\n(.*?)```", README.read_text(), re.DOTALL)
    assert example is not None
    (tmp_path / "example.toml").write_text(example.group(1))
    loaded = load_manifests([tmp_path], environ={"WEATHER_TOKEN": "t"},
                            tool_validator=validate_tool_entry)
    assert loaded.problems == [] and set(loaded.tools) == {"weather", "grep"}
    schema = tool_entry_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    raw = tomllib.loads(example.group(1))["tools"]
    for entry in raw.values():
        assert list(jsonschema.Draft202012Validator(schema).iter_errors(entry)) == []
    assert list(jsonschema.Draft202012Validator(schema).iter_errors({"kind": "ftp"}))


def test_the_readme_documents_every_key():
    text = README.read_text()
    models = (HttpToolConfig, HttpRequestConfig, CommandToolConfig)
    documented = set(re.findall(r"^\| `([a-z_]+)`", text, re.MULTILINE))
    for model in models:
        missing = set(model.model_fields) - documented
        assert not missing, f"{model.__name__}: undocumented keys {sorted(missing)}"
