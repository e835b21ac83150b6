"""A skills-declaring MCP server (SEP-2640, `io.modelcontextprotocol/skills` with
`directoryRead`) for the facade tests, on stdio (lowlevel SDK `Server`, both eras).

Two skills under `skill://`: `pdf-processing` (SKILL.md and `references/FORMS.md`) and
`csv-cleaning` (SKILL.md only). `skills/list` (one page, or `--page-size N` pages with a
cursor), `skills/get` (-32602 for an unknown URI), `resources/directory/read` (a skill's
directory and its `references` subdirectory; -32602 for anything else), `resources/list` (the
SKILL.md files, named and described by their frontmatter) and `resources/read` (every file).

    python skills_server.py [--page-size N]
"""

from __future__ import annotations

import hashlib
import sys
import warnings
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

warnings.simplefilter("ignore")

SKILLS = "io.modelcontextprotocol/skills"
DIRECTORY = "inode/directory"
FILES: dict[str, dict[str, str]] = {
    "pdf-processing": {
        "SKILL.md": (
            "---\nname: pdf-processing\ndescription: Extract, fill, and assemble PDF documents\n"
            "license: MIT\n---\n\n# PDF processing\n\nSkill body. Forms: references/FORMS.md\n"
        ),
        "references/FORMS.md": "# Forms\n\nFill AcroForm fields by name.\n",
    },
    "csv-cleaning": {
        "SKILL.md": (
            "---\nname: csv-cleaning\ndescription: Normalise headers and types of CSV files\n"
            "---\n\n# CSV cleaning\n\nTrim, dedupe, type each column.\n"
        ),
    },
}
FRONTMATTER: dict[str, dict[str, Any]] = {
    "pdf-processing": {"name": "pdf-processing",
                       "description": "Extract, fill, and assemble PDF documents",
                       "license": "MIT"},
    "csv-cleaning": {"name": "csv-cleaning",
                     "description": "Normalise headers and types of CSV files"},
}
PAGE = int(sys.argv[sys.argv.index("--page-size") + 1]) if "--page-size" in sys.argv else 0


def _uri(skill: str, path: str = "SKILL.md") -> str:
    return f"skill://{skill}/{path}"


def _entry(skill: str) -> dict[str, Any]:
    files = [{"uri": _uri(skill, path),
              "digest": "sha256:" + hashlib.sha256(text.encode()).hexdigest(),
              "size": len(text.encode())}
             for path, text in FILES[skill].items()]
    return {"uri": _uri(skill), "frontmatter": FRONTMATTER[skill], "resources": files}


class ListParams(types.RequestParams):
    cursor: str | None = None


class GetParams(types.RequestParams):
    uri: str


class DirectoryParams(types.RequestParams):
    uri: str
    cursor: str | None = None


CACHE: dict[str, Any] = {"resultType": "complete", "ttlMs": 0, "cacheScope": "public"}


async def skills_list(ctx: Any, params: ListParams) -> dict[str, Any]:
    names = list(FILES)
    start = int(params.cursor) if params.cursor else 0
    end = start + PAGE if PAGE else len(names)
    result: dict[str, Any] = {**CACHE, "skills": [_entry(n) for n in names[start:end]]}
    if end < len(names):
        result["nextCursor"] = str(end)
    return result


async def skills_get(ctx: Any, params: GetParams) -> dict[str, Any]:
    for skill in FILES:
        if params.uri == _uri(skill):
            return {**CACHE, "skill": _entry(skill)}
    raise MCPError(types.INVALID_PARAMS, f"unknown skill {params.uri!r}")


async def directory_read(ctx: Any, params: DirectoryParams) -> dict[str, Any]:
    for skill, files in FILES.items():
        base = f"skill://{skill}"
        if params.uri == base:
            children = [{"uri": _uri(skill, p), "name": p, "mimeType": "text/markdown"}
                        for p in files if "/" not in p]
            if any("/" in p for p in files):
                children.append({"uri": f"{base}/references", "name": "references",
                                 "mimeType": DIRECTORY})
            return {"resources": children}
        if params.uri == f"{base}/references" and any("/" in p for p in files):
            return {"resources": [
                {"uri": _uri(skill, p), "name": p.rsplit("/", 1)[1], "mimeType": "text/markdown"}
                for p in files if p.startswith("references/")]}
    raise MCPError(types.INVALID_PARAMS, f"{params.uri!r} is not a directory of this server")


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[])  # the gateway lists every server's tools


async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=[
        types.Resource(uri=_uri(skill), name=FRONTMATTER[skill]["name"],
                       description=FRONTMATTER[skill]["description"], mime_type="text/markdown")
        for skill in FILES])


async def read_resource(
    ctx: Any, params: types.ReadResourceRequestParams
) -> types.ReadResourceResult:
    uri = str(params.uri)
    for skill, files in FILES.items():
        for path, text in files.items():
            if uri == _uri(skill, path):
                return types.ReadResourceResult(contents=[
                    types.TextResourceContents(uri=uri, mime_type="text/markdown", text=text)])
    raise MCPError(types.INVALID_PARAMS, f"no resource {uri!r}")


def build_server() -> Server[Any]:
    server: Server[Any] = Server("skills", version="1.0.0", on_list_tools=list_tools,
                                 on_list_resources=list_resources, on_read_resource=read_resource)
    server.add_request_handler("skills/list", ListParams, skills_list)
    server.add_request_handler("skills/get", GetParams, skills_get)
    server.add_request_handler("resources/directory/read", DirectoryParams, directory_read)
    server.extensions[SKILLS] = {"directoryRead": True}
    return server


async def main() -> None:
    server = build_server()
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
