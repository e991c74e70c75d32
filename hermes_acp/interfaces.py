"""The seams of hermes-acp (see docs/architecture.md). Few, and each real."""

from __future__ import annotations

from typing import Any

from zope.interface import Attribute, Interface


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

    def absolute(path: Any) -> str:
        """``path`` as an absolute path (relative ones start at the session's folder)."""

    def toolStarted(callId: str, name: str, args: dict[str, Any], extras: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ``tool_call`` update for a call that is about to run; ``extras`` are
        what the engine adds (such as the resolved ``path``)."""

    def toolFinished(
        callId: str, name: str, args: dict[str, Any], result: Any, failed: bool, extras: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The final ``tool_call_update`` (status completed or failed); ``extras``
        carry the edit (``path``, ``oldText``, ``newText``) or the command's
        ``output``, ``exitCode`` and client ``terminalId``."""

    def permissionToolCall(callId: str, name: str, args: dict[str, Any], detail: dict[str, Any]) -> dict[str, Any]:
        """The ``toolCall`` shown in a permission request (diff or command)."""


class ISessionStore(Interface):
    """Sessions in memory and on disk. Called in the reactor thread; disk work
    happens off it. Methods that touch the disk return an awaitable (a
    coroutine or a Deferred)."""

    sessions = Attribute("The live sessions: a dict of session id to state.")

    def create(cwd: str, additionalDirectories: list[str], **settings: Any) -> Any:
        """Awaitable: a new session; ``settings`` are initial state fields (e.g. ``model``)."""

    def get(sessionId: str) -> Any:
        """Awaitable: the session's state, loaded from disk if needed; fails with
        ResourceNotFound for an unknown id."""

    def remove(sessionId: str) -> Any:
        """Awaitable: forget it in memory and delete it from disk."""

    def fork(sessionId: str, cwd: str, additionalDirectories: list[str]) -> Any:
        """Awaitable: a deep copy under a new id."""

    def list(cwd: str | None, cursor: str | None) -> Any:
        """Awaitable: (records, nextCursor), newest first."""

    def forget(state: Any) -> None:
        """Drop one session from memory (its journal is written first)."""

    def cleanup() -> Any:
        """Release every in-memory session (Deferred)."""

    def save(state: Any, touch: bool = True) -> Any:
        """Deferred: persist the session's settings (title, model, mode, config, cwd)."""

    def journalUpdate(state: Any, update: dict[str, Any]) -> None:
        """Remember an update sent to the editor, for replay on ``session/load``."""

    def replay(state: Any) -> Any:
        """Awaitable: the journal to replay (a Replay)."""

    def beginTurn(state: Any) -> Any:
        """Awaitable: mark a prompt turn as running."""

    def endTurn(state: Any, messages: list[dict[str, Any]]) -> Any:
        """Awaitable: make the finished turn durable (journal, new messages, idle state)."""

    def replaceHistory(state: Any, messages: list[dict[str, Any]]) -> Any:
        """Awaitable: replace the conversation the model sees."""


class IAgentFactory(Interface):
    """Builds the synchronous agent for one session."""

    def buildAgent(session: Any) -> Any:
        """An agent bound to the session's model, cwd and tools."""

    def configure(agent: Any, session: Any) -> None:
        """Apply the session's changed model, mode or thought level to its agent."""
