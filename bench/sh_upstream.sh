#!/usr/bin/env bash
# A minimal MCP server over stdio in bash: for the startup benchmark (`bench/compare.py`,
# section 4). `bench/light_upstream.py` still starts a Python interpreter (~30 ms of CPU); this
# one starts in ~3 ms, so 20 of them show what the sidecar itself adds per server, and how
# much of the rest is the machine spawning processes. Line-oriented JSON-RPC matched with bash
# regular expressions, good for the requests a client sends at start (`initialize`,
# `tools/list`, `tools/call` of `echo` with plain text, `ping`); any other request gets
# "method not found" at once, so the sidecar's `auto` probe (`server/discover`) falls back.
tools='{"tools":[{"name":"echo","description":"Echo the text back","inputSchema":{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}}]}'
while IFS= read -r line; do
  [[ $line =~ \"id\":[[:space:]]*(\"[^\"]*\"|-?[0-9]+) ]] || continue
  id=${BASH_REMATCH[1]}
  [[ $line =~ \"method\":[[:space:]]*\"([^\"]*)\" ]]; method=${BASH_REMATCH[1]}
  case $method in
    initialize)
      [[ $line =~ \"protocolVersion\":[[:space:]]*\"([^\"]*)\" ]]; v=${BASH_REMATCH[1]:-2025-06-18}
      printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"%s","capabilities":{"tools":{}},"serverInfo":{"name":"sh-upstream","version":"1.0"}}}\n' "$id" "$v";;
    tools/list) printf '{"jsonrpc":"2.0","id":%s,"result":%s}\n' "$id" "$tools";;
    tools/call)
      [[ $line =~ \"text\":[[:space:]]*\"(([^\"\\]|\\.)*)\" ]]; t=${BASH_REMATCH[1]}
      printf '{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"%s"}]}}\n' "$id" "$t";;
    ping) printf '{"jsonrpc":"2.0","id":%s,"result":{}}\n' "$id";;
    *) printf '{"jsonrpc":"2.0","id":%s,"error":{"code":-32601,"message":"method not found: %s"}}\n' "$id" "$method";;
  esac
done
