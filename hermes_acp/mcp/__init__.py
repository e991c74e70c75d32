"""The MCP client: the editor's (and config.yaml's) MCP servers, per session.

Reactor side (Twisted): ``specs`` reads the server lists, ``wire`` speaks
JSON-RPC to one server over ``stdio`` or ``http``, ``link`` is one server of
one session (handshake, era, tools, calls), ``toolset`` turns its tools into
engine tools and its results into what the model reads and the editor shows,
and ``registry`` owns every session's servers.
"""
