"""Plugins used by tests/registry/test_plugins.py (imported by dotted reference)."""

from pydantic import BaseModel

from sidecar import Tool, ToolResponse


class In(BaseModel):
    text: str = ""


async def _run(args, ctx):
    return ToolResponse(content=f"plugin says {args.text}")


def tool(description: str = "from a plugin") -> Tool:
    return Tool(description=description, input=In, execute=_run)


def activate(tools):
    tools.register({"hello": tool()}, namespace="sample")


async def activate_async(tools):
    tools.register({"async_hello": tool()})


def activate_then_fail(tools):
    tools.register({"partial": tool()})
    raise RuntimeError("plugin blew up after registering")


def not_a_function_value():
    return None


NOT_CALLABLE = 42
