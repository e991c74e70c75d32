"""The seams of hermes-acp (see docs/architecture.md). Few, and each real."""

from __future__ import annotations

from typing import Any

from zope.interface import Interface


class IPermissionBroker(Interface):
    """Asks the editor about one tool call. Called in the reactor thread."""

    def requestPermission(sessionId: str, toolCall: dict[str, Any], kind: str) -> Any:
        """Ask about ``toolCall`` (a ToolCallUpdate); ``kind`` is "edit" or "execute".

        Returns a Deferred firing with one of "allow_once", "allow_always",
        "reject_once", "reject_always", "cancelled", "timeout" or "failed";
        the last three mean deny. Requests for one session are serialized.
        """


class IRenderer(Interface):
    """Pure mapping from agent events to ACP ``session/update`` payloads. No I/O."""

    def toolStarted(callId: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """The ``tool_call`` update for a call that is about to run."""

    def toolFinished(callId: str, name: str, args: dict[str, Any], result: Any, failed: bool) -> dict[str, Any]:
        """The final ``tool_call_update`` (status completed or failed)."""

    def permissionToolCall(callId: str, name: str, args: dict[str, Any], detail: dict[str, Any]) -> dict[str, Any]:
        """The ``toolCall`` shown in a permission request (diff or command)."""


class ISessionStore(Interface):
    """Sessions in memory and on disk. Called in the reactor thread; disk work
    happens off it and is returned as Deferreds."""

    def create(cwd: str, additionalDirectories: list[str]) -> Any:
        """A new session (Deferred firing with its state)."""

    def get(sessionId: str) -> Any:
        """Deferred firing with the session's state, loading it from disk if needed;
        fails with ResourceNotFound for an unknown id."""

    def remove(sessionId: str) -> Any:
        """Forget it in memory and delete it from disk (Deferred)."""

    def fork(sessionId: str, cwd: str, additionalDirectories: list[str]) -> Any:
        """Deferred firing with a deep copy under a new id."""

    def list(cwd: str | None, cursor: str | None) -> Any:
        """Deferred firing with (states, nextCursor), newest first."""

    def cleanup() -> Any:
        """Release every in-memory session (Deferred)."""


class IAgentFactory(Interface):
    """Builds the synchronous agent for one session."""

    def buildAgent(session: Any) -> Any:
        """An agent bound to the session's model, cwd and tools."""

