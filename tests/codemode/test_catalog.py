"""The catalog delivered separately: Python paths, `search_tools` ranking, `describe_tools`
stubs generated from JSON Schemas."""

from __future__ import annotations

import ast
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from sidecar import Tool, ToolResponse
from sidecar.codemode.catalog import Catalog, identifier
from sidecar.codemode.search import search, tokens
from sidecar.codemode.stubs import describe
from sidecar.model.content import text_of
from sidecar.model.errors import ErrorKind
from sidecar.registry.registry import Entry, Registry

from .conftest import Env, ctx


async def _noop(args: Any, context: Any) -> ToolResponse:
    return ToolResponse(content="ok")


def tool(description: str = "d", input: Any = None, output: Any = None, **options: Any) -> Tool:
    return Tool(description=description, input=input or {"type": "object"}, output=output,
                execute=_noop, **options)


def catalog_of(*registrations: tuple[dict[str, Tool], str | None]) -> Catalog:
    registry = Registry()
    for mapping, namespace in registrations:
        registry.register(mapping, namespace=namespace)
    return Catalog(registry.effective())


def entries(**tools: Tool) -> dict[str, Entry]:
    registry = Registry()
    registry.register(tools)
    return dict(registry.effective())


# --- paths ----------------------------------------------------------------------------------


def test_paths_follow_namespaces_from_the_tool_or_the_registration():
    catalog = catalog_of(
        ({"read_file": tool(), "list-dir": tool()}, "fs"),
        ({"status": tool(namespace="git.remote")}, None),
        ({"plain": tool(), "class": tool(), "2fa": tool()}, None),
    )
    calls = {t.name: t.call_example for t in catalog.tools}
    assert calls["fs_read_file"] == "tools.fs.read_file(...)"
    assert calls["fs_list-dir"] == "tools.fs.list_dir(...)"
    assert calls["git_remote_status"] == "tools.git.remote.status(...)"
    assert calls["plain"] == "tools.plain(...)"
    assert calls["class"] == "tools.class_(...)"
    assert calls["_2fa"] == "tools.t_2fa(...)"
    assert catalog.find("fs.read_file") is catalog.find("tools.fs.read_file(...)")
    assert catalog.find('call_tool("plain")') is catalog.get("plain")


def test_path_collisions_fall_back_to_call_tool():
    catalog = catalog_of(({"a-b": tool(), "a_b": tool()}, None), ({"x": tool()}, "fs"),
                         ({"fs": tool()}, None))
    by_name = {t.name: t for t in catalog.tools}
    assert by_name["a-b"].path == ("a_b",) and by_name["a_b"].path is None
    assert by_name["a_b"].call_example == 'call_tool("a_b", ...)'
    assert by_name["fs"].path is None  # the namespace `fs` already sits there
    assert catalog.tree["fs"] == {"x": "fs_x"}


def test_identifier():
    assert identifier("read-file") == "read_file"
    assert identifier("__init__") == "init__"
    assert identifier("import") == "import_"
    assert identifier("match") == "match_"
    assert identifier("___") is None


# --- search ---------------------------------------------------------------------------------


def search_catalog() -> Catalog:
    return catalog_of(
        ({"read_file": tool("Read a text file from the workspace.",
                            {"type": "object", "properties": {"path": {"type": "string"}}}),
          "write_file": tool("Write a file.", title="Save a file")}, "fs"),
        ({"list_issues": tool("List the issues of a repository.",
                              {"type": "object", "properties": {"repo": {"type": "string"},
                                                                "state": {"type": "string"}}}),
          "create_issue": tool("Open a new issue.")}, "issues"),
        ({"evaluate": tool("Evaluate an arithmetic expression; mentions a file in passing.",
                           {"type": "object", "properties": {"file_hint": {}}})}, "calc"),
    )


def test_tokens_split_words_and_humps():
    assert tokens("readFile_v2 HTTPServer") == ["read", "file", "v2", "http", "server"]


def test_search_ranks_names_over_descriptions():
    hits, total = search(search_catalog(), "file", 10)
    names = [h.tool.name for h in hits]
    assert names[:2] == ["fs_read_file", "fs_write_file"]
    assert names[-1] == "calc_evaluate" and total == 3


def test_search_uses_titles_parameters_and_prefixes():
    catalog = search_catalog()
    assert [h.tool.name for h in search(catalog, "save", 5)[0]] == ["fs_write_file"]
    assert search(catalog, "repo state", 5)[0][0].tool.name == "issues_list_issues"
    assert {h.tool.name for h in search(catalog, "issue", 5)[0]} == {
        "issues_list_issues", "issues_create_issue"
    }


def test_search_lists_all_for_star_and_respects_limit():
    hits, total = search(search_catalog(), "*", 2)
    assert total == 5 and [h.tool.name for h in hits] == ["calc_evaluate", "fs_read_file"]
    assert search(search_catalog(), "kubernetes", 5) == ([], 0)


# --- stubs ----------------------------------------------------------------------------------


class Address(BaseModel):
    city: str
    zip: str | None = None


class Person(BaseModel):
    name: str = Field(description="Full name")
    friends: list[Person] = []
    address: Address | None = None
    role: Literal["admin", "user"] = "user"


def stub_for(input: Any, output: Any = None, name: str = "people_add") -> str:
    registry = Registry()
    namespace, key = name.split("_", 1) if "_" in name else (None, name)
    registry.register({key: tool("Add a person.", input, output)}, namespace=namespace)
    text = describe(Catalog(registry.effective()).tools)
    ast.parse(text)  # always valid Python
    return text


def test_stub_from_pydantic_schema_with_refs_recursion_and_optionals():
    text = stub_for(Person, Person)
    assert "async def add(*, name: str, friends: list[Person] = ..., address: Address | None "\
        "= None, role: Literal['admin', 'user'] = 'user') -> Person:" in text
    assert "class Person(TypedDict):" in text and "    friends: NotRequired[list[Person]]" in text
    assert "class Address(TypedDict):\n    city: str\n    zip: NotRequired[str | None]" in text
    assert "Call: await tools.people.add(...)  [people_add]" in text
    assert "name: Full name" in text
    assert text.count("class Person(TypedDict)") == 1


def test_stub_from_raw_json_schema():
    schema = {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
            "point": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}]},
            "meta": {"type": "object", "additionalProperties": {"type": "integer"}},
            "anything": {},
            "either": {"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]},
            "kind": {"const": "x"},
            "nested": {"type": "object", "properties": {"deep": {"type": "object",
                       "properties": {"v": {"type": ["boolean", "null"]}}, "required": ["v"]}}},
            "merged": {"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}},
                                 {"type": "object", "properties": {"b": {"type": "integer"}},
                                  "required": ["b"]}]},
            "odd": {"type": "object", "properties": {"x-y": {"type": "string"}}},
        },
        "required": ["tags"],
    }
    out = {"type": "array", "items": {"$ref": "#/$defs/Row"},
           "$defs": {"Row": {"type": "object", "properties": {"id": {"type": "integer"}},
                             "required": ["id"]}}}
    text = stub_for(schema, out, "db_query")
    assert "tags: list[Literal['a', 'b']]" in text
    assert "point: tuple[float, float] = ..." in text
    assert "meta: dict[str, int] = ..." in text
    assert "anything: Any = ..." in text
    assert "either: str | int | None = ..." in text
    assert "kind: Literal['x'] = ..." in text
    assert "class DbQueryNestedDeep(TypedDict):\n    v: bool | None" in text
    assert "nested: DbQueryNested = ..." in text
    assert "class DbQueryMerged(TypedDict):\n    a: NotRequired[str]\n    b: int" in text
    assert "DbQueryOdd = TypedDict('DbQueryOdd', {'x-y': NotRequired[str]})" in text
    assert "-> list[Row]:" in text and "class Row(TypedDict):\n    id: int" in text


def test_stub_for_non_identifier_parameters_and_text_tools():
    text = stub_for({"type": "object", "properties": {"from": {"type": "string"}},
                     "required": ["from"]}, None, "mail_send")
    assert "MailSendInput = TypedDict('MailSendInput', {'from': str})" in text
    assert "async def send(**kwargs: Unpack[MailSendInput]) -> str:" in text
    assert "Returns the tool's text content." in text
    assert text.startswith("from typing import Any, Literal, NotRequired, TypedDict, Unpack")


# --- through the seam -------------------------------------------------------------------------



@pytest.mark.anyio
async def test_search_tools_builtin(env: Env):
    snapshot = env.snapshot()
    outcome = await snapshot.execute("search_tools", {"query": "issues search"}, ctx())
    assert outcome.status == "completed"
    first = outcome.output["results"][0]
    assert first["name"] == "issues_search" and first["call"] == "tools.issues.search(...)"
    assert text_of(outcome.content).splitlines()[0] == (
        "tools.issues.search(...)  [issues_search]  Search issues by words in their titles."
    )
    secret = await snapshot.execute("search_tools", {"query": "secret direct"}, ctx("c2"))
    assert all(r["name"] != "secret" for r in secret.output["results"])
    nothing = await snapshot.execute("search_tools", {"query": "kubernetes"}, ctx("c3"))
    assert "No tool matches 'kubernetes'" in text_of(nothing.content)


@pytest.mark.anyio
async def test_describe_tools_builtin(env: Env):
    snapshot = env.snapshot()
    outcome = await snapshot.execute(
        "describe_tools", {"names": ["issues.search", "calc_add", "clac_add"]}, ctx()
    )
    text = text_of(outcome.content)
    assert ("async def search(*, query: str, state: Literal['open', 'closed'] = ..., "
            "limit: int = 5) -> IssuesSearchOutput:") in text
    assert "class IssuesSearchOutputIssuesItem(TypedDict):\n    id: int\n    title: str" in text
    assert "async def add(*, a: int, b: int = 0) -> CalcAddOutput:" in text
    assert "# No tool 'clac_add' (did you mean calc_add?)." in text
    assert outcome.output["missing"] == ["clac_add"]
    missing = await snapshot.execute("describe_tools", {"names": ["secret"]}, ctx("c2"))
    assert missing.error is not None and missing.error.kind is ErrorKind.TOOL_FAILURE
    assert "search_tools" in missing.error.message


def test_a_namespace_named_like_a_sandbox_module_gets_a_trailing_underscore():
    """mcp-server-time's tools sit in namespace `time`, a module the sandbox provides itself
    (so are `json`, `re`, `math`, ...): their module under `tools` is `time_`."""
    catalog = catalog_of(({"convert_time": tool()}, "time"), ({"loads": tool()}, "json"),
                         ({"time": tool()}, None))
    calls = {t.name: t.call_example for t in catalog.tools}
    assert calls["time_convert_time"] == "tools.time_.convert_time(...)"
    assert calls["json_loads"] == "tools.json_.loads(...)"
    assert calls["time"] == "tools.time(...)"  # a function may take a module's name
    assert catalog.find("time_.convert_time") is catalog.get("time_convert_time")


@pytest.mark.anyio
async def test_a_program_calls_the_tools_of_a_namespace_named_time(env: Env):
    async def convert(args: dict[str, Any], context: Any) -> ToolResponse:
        return ToolResponse(content=f"{args['time']} in {args['zone']}")

    schema = {"type": "object", "properties": {"time": {"type": "string"},
                                               "zone": {"type": "string"}}}
    async with env.location.tools.register(
            {"convert_time": Tool(description="Convert a time.", input=schema,
                                  execute=convert)}, namespace="time"):
        outcome = await env.run('await tools.time_.convert_time(time="09:00", zone="UTC")')
    assert outcome.status == "completed", outcome.error
    assert outcome.output["result"] == "09:00 in UTC"


def test_stubs_write_a_shape_once_whatever_its_name():
    """server-memory's entity is the items of create_entities' input, of its output and of
    read_graph's output: one TypedDict, reused by name."""
    entity = {"type": "object", "properties": {"name": {"type": "string",
                                                        "description": "The entity's name"},
                                               "observations": {"type": "array",
                                                                "items": {"type": "string"}}},
              "required": ["name", "observations"]}
    entities = {"type": "object", "properties": {"entities": {"type": "array", "items": entity}},
                "required": ["entities"]}
    registry = Registry()
    registry.register({"create_entities": tool("Create.", entities, entities),
                       "read_graph": tool("Read.", {"type": "object"}, entities)},
                      namespace="memory")
    text = describe(Catalog(registry.effective()).tools)
    ast.parse(text)
    assert text.count("    name: str  # The entity's name") == 1
    assert "class MemoryCreateEntitiesEntitiesItem(TypedDict):" in text
    assert "async def create_entities(*, entities: list[MemoryCreateEntitiesEntitiesItem]) -> " \
        "MemoryCreateEntitiesOutput:" in text
    assert "class MemoryCreateEntitiesOutput(TypedDict):\n    entities: " \
        "list[MemoryCreateEntitiesEntitiesItem]" in text
    assert "async def read_graph() -> MemoryCreateEntitiesOutput:" in text
