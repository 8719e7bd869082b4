"""A hand-written stdio "MCP server" that breaks the protocol on purpose (no SDK).

``python tests/mcp_raw_server.py MODE``: it answers ``initialize`` and ``tools/list``
properly (one tool, ``garble``), then answers ``tools/call`` according to MODE:

* ``garbage`` — a line that is not JSON;
* ``not-jsonrpc`` — a JSON object that is not a JSON-RPC message;
* ``wrong-id`` — a well-formed response to a request id nobody sent;
* ``silent`` — nothing at all (the call must time out);
* ``exit`` — the process exits.
"""

from __future__ import annotations

import json
import sys

TOOL = {
    "name": "garble",
    "description": "Answer the call with a broken message.",
    "inputSchema": {"type": "object", "properties": {}},
}


def send(message: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main(mode: str) -> None:
    for line in sys.stdin:
        request = json.loads(line)
        method, ident = request.get("method"), request.get("id")
        if ident is None:
            continue  # a notification
        if method == "initialize":
            version = request["params"]["protocolVersion"]
            send({"jsonrpc": "2.0", "id": ident, "result": {
                "protocolVersion": version,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "raw", "version": "0"},
            }})  # fmt: skip
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": ident, "result": {"tools": [TOOL]}})
        elif method == "tools/call":
            if mode == "garbage":
                sys.stdout.write("this is not JSON-RPC {\n")
                sys.stdout.flush()
            elif mode == "not-jsonrpc":
                send({"hello": "world"})
            elif mode == "wrong-id":
                send({"jsonrpc": "2.0", "id": 987654, "result": {"content": []}})
            elif mode == "exit":
                sys.exit(4)
            # silent: say nothing
        else:
            send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": method}})


if __name__ == "__main__":
    main(sys.argv[1])
