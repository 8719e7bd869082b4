"""MCP servers as a tool kind (``docs/mcp.md``).

* :mod:`.config` — ``[mcp.servers.NAME]`` of ``tether.toml`` (pure);
* :mod:`.manager` — one event loop in a background thread speaks to every server through
  the official ``mcp`` SDK: lazy start, reuse, timeouts, stop at exit, the reaper;
* :mod:`.tools` — ``McpTool`` (never replayed unless trusted) and ``McpEffectTool`` (a
  configured lookup: ``lookupByOperationId``), built by :func:`.tools.mcp_tools`.
"""
