"""The synchronous agent engine: model client, tools, guards. Imports no Twisted."""
