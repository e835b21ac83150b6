"""`sidecar search`, `add` and `remove` against a registry served on 127.0.0.1 with the real
API's shapes (tests/cli/registry_app.py) and against the same servers in a catalog file: what
is listed, the manifest file written, where the secrets go (and that they never reach the
manifest), and every refusal with its one line. The daemon side is
tests/e2e/test_registry_install.py."""

from __future__ import annotations

import io
import json
import os
import stat
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli.commands import main
from tests.cli.registry_app import (
    EVERYTHING_VERSION,
    TIME_VERSION,
    ServedRegistry,
    time_server,
    write_catalog,
)

REMOTE_HOST = "127.0.0.1:9"
TIME = "io.github.modelcontextprotocol/time"


@pytest.fixture(scope="module")
def registry() -> Iterator[str]:
    with ServedRegistry(REMOTE_HOST) as served:
        yield served.url


@pytest.fixture
def where(tmp_path: Path) -> dict[str, Path]:
    return {"manifests": tmp_path / "manifests", "state": tmp_path / "state",
            "catalog": write_catalog(tmp_path / "catalog.json", REMOTE_HOST)}


def sidecar(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
            *args: str, stdin: str = "") -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def add(capsys: Any, monkeypatch: Any, where: dict[str, Path], *args: str,
        stdin: str = "") -> tuple[int, str, str]:
    return sidecar(capsys, monkeypatch, "add", *args, "--manifests", str(where["manifests"]),
                   "--state-dir", str(where["state"]), stdin=stdin)


def entry(where: dict[str, Path], key: str) -> dict[str, Any]:
    server: dict[str, Any] = tomllib.loads(
        (where["manifests"] / f"{key}.toml").read_text())["mcpServers"][key]
    return server


def test_search_lists_name_version_transports_and_secrets_from_api_and_catalog(
        registry, where, capsys, monkeypatch) -> None:
    code, out, err = sidecar(capsys, monkeypatch, "search", "--registry", registry, "--json")
    assert code == 0, err
    found = {s["name"]: s for s in json.loads(out)}  # 5 latest servers over 3 pages of 2
    assert sorted(found) == sorted([
        "io.github.modelcontextprotocol/everything", TIME, "com.example/weather",
        "io.github.someone/time", "io.docker/dockerized"])
    assert found[TIME] == {"name": TIME, "version": TIME_VERSION,
                           "description": "Time and timezone conversion capabilities",
                           "transports": ["pypi:stdio"], "secrets": True}
    everything = found["io.github.modelcontextprotocol/everything"]
    assert everything["version"] == EVERYTHING_VERSION and not everything["secrets"]
    assert found["com.example/weather"]["transports"] == ["remote:streamable-http"]

    code, text, _ = sidecar(capsys, monkeypatch, "search", "TIMEZONE", "--registry", registry)
    assert code == 0
    assert text.splitlines() == [
        f"{TIME}  {TIME_VERSION}  pypi:stdio  needs secrets",
        "    Time and timezone conversion capabilities"]
    code, same, _ = sidecar(capsys, monkeypatch, "search", "TIMEZONE", "--registry",
                            str(where["catalog"]))
    assert (code, same) == (0, text)


def test_add_npm_writes_one_entry_with_npx_sandbox_and_pin(
        registry, where, capsys, monkeypatch) -> None:
    code, out, err = add(capsys, monkeypatch, where, "everything", "--registry", registry,
                         "--yes")
    assert code == 0, err
    written = where["manifests"] / "everything.toml"
    assert entry(where, "everything") == {
        "command": "npx",
        "args": ["-y", f"@modelcontextprotocol/server-everything@{EVERYTHING_VERSION}",
                 "stdio"],
        "sandbox": True, "pin": "hold"}
    assert written.read_text().startswith(f"# Installed by `sidecar add` from {registry}\n")
    assert out == f"# {written}\n{written.read_text()}"  # shown as written
    assert f"wrote {written}" in err
    assert not (where["state"] / "secrets").exists()

    code, _, err = add(capsys, monkeypatch, where, "everything", "--registry", registry,
                       "--yes")
    assert code == 2 and "exists already (`sidecar remove everything` first" in err
    code, _, err = add(capsys, monkeypatch, where, "io.github.modelcontextprotocol/everything",
                       "--registry", registry, "--version", "2025.9.25", "--as", "old", "--yes")
    assert code == 0, err
    assert entry(where, "old")["args"][1] == "@modelcontextprotocol/server-everything@2025.9.25"


def test_a_secret_goes_to_a_0600_file_and_the_manifest_only_references_it(
        registry, where, capsys, monkeypatch, tmp_path) -> None:
    code, _, err = add(capsys, monkeypatch, where, TIME, "--registry", registry, "--yes")
    assert code == 2
    assert err == (f"sidecar: {TIME} needs TIME_API_KEY (give --secret TIME_API_KEY=...)\n")
    assert not where["manifests"].joinpath("time.toml").exists()
    assert not (where["state"] / "secrets").exists()

    (tmp_path / "key.txt").write_text("tk-0123456789abcdef\n")
    code, out, err = add(capsys, monkeypatch, where, TIME, "--registry", str(where["catalog"]),
                         "--yes", "--secret", f"TIME_API_KEY=@{tmp_path / 'key.txt'}",
                         "--set", "TIME_LOG_LEVEL=debug")
    assert code == 0, err
    secret = where["state"] / "secrets" / "time" / "TIME_API_KEY"
    assert entry(where, "time") == {
        "command": "uvx", "args": [f"mcp-server-time=={TIME_VERSION}", "--local-timezone=UTC"],
        "env": {"TIME_API_KEY": "${file:" + str(secret) + "}", "TIME_LOG_LEVEL": "debug"},
        "sandbox": True, "pin": "hold"}
    assert secret.read_text() == "tk-0123456789abcdef\n"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    for directory in (where["state"], where["state"] / "secrets", secret.parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert "tk-0123456789abcdef" not in (where["manifests"] / "time.toml").read_text() + out


def test_asked_for_secrets_and_the_confirmation_come_from_the_user(
        registry, where, capsys, monkeypatch) -> None:
    code, out, err = add(capsys, monkeypatch, where, TIME, "--registry", registry,
                         stdin="typed-secret\nn\n")
    assert code == 1
    assert "TIME_API_KEY (secret; Key of the time service; required): " in err
    assert f"Write {where['manifests'] / 'time.toml'}? [y/N]" in err
    assert "sidecar: nothing written" in err and "[mcpServers.time]" in out
    assert not (where["manifests"] / "time.toml").exists()
    assert not (where["state"] / "secrets").exists()

    code, out, err = add(capsys, monkeypatch, where, TIME, "--registry", registry,
                         stdin="typed-secret\ny\n")
    assert code == 0, err
    assert (where["state"] / "secrets/time/TIME_API_KEY").read_text() == "typed-secret\n"
    assert "typed-secret" not in out + err


def test_a_remote_becomes_an_http_entry_with_its_header_secret_and_url_variable(
        registry, where, capsys, monkeypatch) -> None:
    code, _, err = add(capsys, monkeypatch, where, "com.example/weather", "--registry",
                       registry, "--yes", "--secret", "token=wx-secret")
    assert code == 0, err
    token = where["state"] / "secrets" / "weather" / "token"
    assert entry(where, "weather") == {
        "type": "http", "url": f"http://{REMOTE_HOST}/mcp",
        "headers": {"Authorization": "Bearer ${file:" + str(token) + "}"}, "pin": "hold"}
    assert token.read_text() == "wx-secret\n"


def test_a_server_json_file_installs_without_a_registry(where, capsys, monkeypatch,
                                                        tmp_path) -> None:
    document = tmp_path / "server.json"
    document.write_text(json.dumps(time_server()))
    code, _, err = add(capsys, monkeypatch, where, str(document), "--yes", "--as", "clock",
                       "--secret", "TIME_API_KEY=k")
    assert code == 0, err
    assert entry(where, "clock")["args"][0] == f"mcp-server-time=={TIME_VERSION}"
    assert (where["manifests"] / "clock.toml").read_text().startswith(
        f"# Installed by `sidecar add` from {document}\n")


@pytest.mark.parametrize(("args", "message"), [
    (["time"], "'time' names several servers: io.github.modelcontextprotocol/time, "
               "io.github.someone/time; give the full name"),
    (["dockerized"], "io.docker/dockerized offers oci package over stdio; sidecar add "
                     "installs npm and PyPI packages over stdio, and remotes"),
    ([TIME, "--secret", "TIME_API_KEY=k", "--secret", "API_TOKEN=x"],
     f"--secret API_TOKEN: {TIME} has no such input (its inputs: TIME_API_KEY, "
     "TIME_LOG_LEVEL, local-timezone)"),
    (["everything", "--secret", "novalue"], "--secret 'novalue': write NAME=VALUE|@FILE"),
    (["everything", "--as", "a b"], "--as 'a b': a name of 1-64 letters, digits, '_' or '-'"),
])
def test_refusals_are_one_line_and_write_nothing(registry, where, capsys, monkeypatch,
                                                 args, message) -> None:
    code, _, err = add(capsys, monkeypatch, where, *args, "--registry", registry, "--yes")
    assert (code, err) == (2, f"sidecar: {message}\n")
    assert not any(where["manifests"].glob("*.toml"))


def test_unknown_servers_and_unreachable_registries_name_the_registry(
        registry, where, capsys, monkeypatch, tmp_path) -> None:
    code, _, err = add(capsys, monkeypatch, where, "io.github.nobody/nothing", "--registry",
                       registry, "--yes")
    assert (code, err) == (1, f"sidecar: the registry {registry} has no server "
                           "io.github.nobody/nothing (`sidecar search` lists them)\n")
    code, _, err = add(capsys, monkeypatch, where, "everything", "--registry", registry,
                       "--version", "9.9.9", "--yes")
    assert code == 1 and "has no server io.github.modelcontextprotocol/everything 9.9.9" in err
    code, _, err = sidecar(capsys, monkeypatch, "search", "--registry", "http://127.0.0.1:9")
    assert code == 3 and err.startswith("sidecar: cannot reach the registry http://127.0.0.1:9")
    code, _, err = sidecar(capsys, monkeypatch, "search", "--registry", str(tmp_path / "no"))
    assert code == 1 and err.startswith(f"sidecar: cannot read {tmp_path / 'no'}")


def test_remove_takes_the_entry_and_its_secrets_and_nothing_written_by_hand(
        registry, where, capsys, monkeypatch) -> None:
    assert add(capsys, monkeypatch, where, TIME, "--registry", registry, "--yes",
               "--secret", "TIME_API_KEY=k")[0] == 0
    common = ["--manifests", str(where["manifests"]), "--state-dir", str(where["state"])]
    code, _, err = sidecar(capsys, monkeypatch, "remove", "time", *common)
    assert code == 0, err
    assert not (where["manifests"] / "time.toml").exists()
    assert not (where["state"] / "secrets" / "time").exists()
    code, _, err = sidecar(capsys, monkeypatch, "remove", "time", *common)
    assert code == 1 and f"no time.toml in {where['manifests']}" in err
    (where["manifests"] / "mine.toml").write_text('[mcpServers.mine]\ncommand = "x"\n')
    code, _, err = sidecar(capsys, monkeypatch, "remove", "mine", *common)
    assert code == 2 and "was not written by `sidecar add`" in err
    assert (where["manifests"] / "mine.toml").exists()
    code, _, err = add(capsys, monkeypatch, where, "everything", "--as", "mine", "--registry",
                       registry, "--yes")
    assert code == 2 and "exists already" in err


def test_the_written_entries_pass_sidecar_check(registry, where, capsys, monkeypatch) -> None:
    for args in (["everything"], [TIME, "--secret", "TIME_API_KEY=k"],
                 ["com.example/weather", "--secret", "token=t"]):
        code, _, err = add(capsys, monkeypatch, where, *args, "--registry", registry, "--yes")
        assert code == 0, err
    # `sidecar check` looks the commands up on PATH: uvx is the test extra's `uv`, beside the
    # interpreter, as on a user's PATH once the virtualenv is active (CI does not activate it)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    code, out, err = sidecar(capsys, monkeypatch, "check", str(where["manifests"]))
    assert code == 0, out + err
