"""The MCP client: the editor's (and config.yaml's) MCP servers, per session.

Reactor side (Twisted): ``specs`` reads the server lists, ``wire`` speaks
JSON-RPC to one server over ``stdio``, ``http`` (streamable HTTP) or ``sse``
(the 2024-11-05 HTTP+SSE transport), ``link`` is one server of one session
(handshake, era, tools, prompts, calls), ``toolset`` turns its tools into
engine tools and its results into what the model reads and the editor shows,
``resources`` gives the model its resources, ``prompts`` makes its prompts
slash commands, and ``registry`` owns every session's servers.
"""
