"""The seams of hermes-acp (see docs/architecture.md). Few, and each real: every
method declared here is one that a caller on the other side calls.

This module imports only zope.interface at run time, so the engine (which never
imports Twisted) can declare what it implements too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zope.interface import Attribute, Interface

if TYPE_CHECKING:  # for annotations only; none of these imports this module
    import threading
    from collections.abc import Awaitable, Mapping

    from twisted.internet.defer import Deferred

    from .engine.access import EditProposal
    from .engine.checkpoints import TurnCheckpoint
    from .engine.result import TurnResult
    from .engine.skills import Catalog
    from .engine.tools.registry import Tool
    from .engine.workspace import Workspace
    from .session_state import SessionState
    from .store import JournalTail, SessionRecord

# -- between the engine and the ACP layer -----------------------------------------------


class ITurnObserver(Interface):
    """What one engine run tells the turn that started it. Called on engine threads
    (the run's worker, or a tool's own thread; approvals may come from several tool
    threads at once). ``callId`` names one tool call, uniquely within the run."""

    def text(delta: str) -> None:
        """A piece of the answer."""

    def thought(delta: str) -> None:
        """A piece of the model's reasoning."""

    def toolStarted(callId: str, name: str, arguments: dict[str, Any], extras: dict[str, Any]) -> None:
        """The model asked for a tool call: its card, pending until ``toolRunning`` (or its end,
        for a call that never runs); ``extras`` hold what the engine resolved (its ``path``)."""

    def toolRunning(callId: str) -> None:
        """The call starts running now (a reply's calls wait their turn to run)."""

    def toolEnded(callId: str, name: str, result: str, failed: bool, extras: dict[str, Any]) -> None:
        """The call is over: ``result`` is what the model reads; every started call ends once."""

    def approveCommand(callId: str, command: str, reason: str) -> str:
        """Ask the user about a command; an answer of ``engine.approval.ANSWERS``."""

    def approveEdit(callId: str, proposal: EditProposal) -> str:
        """Ask the user about an edit; an answer of ``ANSWERS``."""

    def approveRead(callId: str, path: str, reason: str) -> str:
        """Ask the user whether the model may read ``path`` (``reason`` says why it
        asks: a secret, or outside the workspace; for a fetch, ``path`` is the URL and
        ``reason`` names the host); an answer of ``ANSWERS``."""

    def approvePlan(callId: str, plan: str) -> str:
        """Show the user the plan the model made in plan mode and ask whether to implement
        it (``engine.planning``); an answer of ``ANSWERS``."""

    def askUser(callId: str, question: str, choices: list[str]) -> tuple[str, str]:
        """Ask the user ``question`` (``choices``: answers to pick from, besides their own
        words; none: free text) for the call; (an action of ``engine.asking``, the
        answer or why there is none)."""

    def terminalStarted(callId: str, terminalId: str) -> None:
        """The editor made a terminal for the call's command."""

    def commandOutput(callId: str, output: str) -> None:
        """The output so far of the call's command, which runs here (not in an
        editor's terminal); a few times a second at most."""

    def callTool(callId: str, name: str, arguments: dict[str, Any]) -> tuple[str, bool, dict[str, Any]]:
        """Run a tool that lives outside the engine (an MCP server's), asking the
        user first where that is the rule; (what the model reads, failed, extras)."""

    def compactionStarted(compactionId: str, reason: str) -> None:
        """The history is being compacted (``reason``: "threshold", "overflow" or "requested")."""

    def compactionText(compactionId: str, delta: str) -> None:
        """A piece of the summary as the model writes it."""

    def compactionEnded(compactionId: str, status: str, summary: str, error: str, before: int, after: int) -> None:
        """"completed" (with what the user is shown), "failed" (with why) or "cancelled";
        ``before`` and ``after`` are the estimated tokens of a request."""

    def subagentStarted(callId: str, child: int, name: str, goal: str) -> None:
        """A child of the ``delegate_task`` call ``callId`` (task index ``child``) starts."""

    def subagentText(callId: str, child: int, delta: str) -> None:
        """A piece of that child's answer (its own calls come as tool events with their own ids)."""

    def subagentEnded(callId: str, child: int, status: str, summary: str) -> None:
        """That child ended: "completed", "failed" or "interrupted", with its summary or why."""


class IEngineAgent(Interface):
    """One session's synchronous agent. ``run_conversation`` runs on a worker thread;
    ``interrupt`` may be called from any thread."""

    contextWindow = Attribute("The model's context window in tokens (None: unknown), set before each run.")
    vision = Attribute("Whether the model can see images (None: unknown), set before each run; a run that "
                       "finds the endpoint refuses them sets it False.")

    def run_conversation(
        user_message: str | list[dict[str, Any]],
        conversation_history: list[dict[str, Any]] | None,
        observer: ITurnObserver,
        workspace: Workspace | None = None,
        cancelEvent: threading.Event | None = None,
        extraTools: Mapping[str, Tool] | None = None,
        checkpoint: TurnCheckpoint | None = None,
        skillsCatalog: Catalog | None = None,
    ) -> TurnResult:
        """Run one turn to its end, reporting to ``observer``, with files and
        commands through ``workspace``; a set ``cancelEvent`` cancels it;
        ``extraTools`` join the agent's own for this run; ``checkpoint`` is taken
        before its first change of files (``engine.checkpoints``); ``skillsCatalog``
        is the session's skills as just read for the turn (None: the agent reads them)."""

    def compact(
        conversation_history: list[dict[str, Any]],
        observer: ITurnObserver,
        focus: str = "",
        cancelEvent: threading.Event | None = None,
        extraTools: Mapping[str, Tool] | None = None,
    ) -> TurnResult:
        """Compact the history now (``/compact``), whatever its size; ``focus`` says what
        the summary should keep; ``extraTools`` are the session's MCP tools, whose schemas
        the next turn sends too. The result's ``history`` is the new one (None: unchanged)."""

    def interrupt() -> None:
        """Cancel the run in progress, if any."""

    def activeTools() -> dict[str, Tool]:
        """The tools the model is offered, by name."""


class IAgentFactory(Interface):
    """Builds and reconfigures the engine agent of a session."""

    def buildAgent(session: SessionState) -> IEngineAgent:
        """An agent for the session's model, folders, mode and thought level."""

    def configure(agent: IEngineAgent, session: SessionState) -> None:
        """Apply the session's changed model, mode or thought level to its agent."""


# -- inside the ACP layer ------------------------------------------------------------------


class IPermissionBroker(Interface):
    """Asks the editor about one tool call. Called in the reactor thread."""

    def requestPermission(sessionId: str, toolCall: dict[str, Any], kind: str) -> Deferred[str]:
        """Ask about ``toolCall`` (a ToolCallUpdate); ``kind`` is "edit", "read", "execute" or "tool" (an MCP tool).

        Returns a Deferred firing with one of ``engine.approval.ANSWERS``; anything but
        an allow denies. Requests for one session are serialized.
        """

    def choose(sessionId: str, toolCall: dict[str, Any], options: list[dict[str, Any]]) -> Deferred[str]:
        """Ask the user to pick one of ``options`` (permission options) about
        ``toolCall``, in the same queue and under the same timeout as the other
        questions; fires with the chosen ``optionId``, or cancelled, timeout or failed."""

    def forget(sessionId: str) -> None:
        """The session is gone: drop its queue of questions."""


class IRenderer(Interface):
    """Pure mapping from engine events to ACP ``session/update`` payloads. No I/O."""

    def toolStarted(callId: str, name: str, args: dict[str, Any], extras: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ``tool_call`` update for a call that is about to run; ``extras`` are
        what the engine adds (such as the resolved ``path``)."""

    def toolFinished(
        callId: str, name: str, args: dict[str, Any], result: str, failed: bool, extras: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The final ``tool_call_update`` (status completed or failed); ``extras``
        carry the edit (``path``, ``oldText``, ``newText``) or the command's
        ``output``, ``exitCode`` and client ``terminalId``."""

    def permissionToolCall(callId: str, name: str, args: dict[str, Any], detail: dict[str, Any]) -> dict[str, Any]:
        """The ``toolCall`` shown in a permission request (diff or command)."""


class IUpdateChannel(Interface):
    """``session/update`` notifications to the editor, and the journal that lets
    ``session/load`` replay them. Called in the reactor thread."""

    paused = Attribute("Whether the editor is behind on reading what was sent.")

    def send(state: SessionState, update: dict[str, Any], journal: bool = True) -> None:
        """Tell the editor about ``state``'s session; remember it for replay unless ``journal`` is false."""

    def notice(state: SessionState, severity: str, title: str, description: str, journal: bool = True) -> None:
        """A ``notice`` where the editor takes them, else a line of agent text."""

    def compaction(state: SessionState, compactionId: str, status: str, text: str = "") -> None:
        """A compaction began ("in_progress") or ended ("completed" with the summary,
        "failed" with why, "cancelled"): ``compaction_update`` where the editor takes it,
        else a "Compact conversation" card; the journal keeps the card."""

    def compactionChunk(state: SessionState, compactionId: str, text: str) -> None:
        """A piece of the summary as it streams (only where the editor takes compactions)."""

    def replay(state: SessionState, update: dict[str, Any]) -> None:
        """Send a journaled update again (``session/load``), in the form this editor takes."""

    def replayRows(state: SessionState, rows: list[tuple[int, bytes, bool, bool]]) -> list[dict[str, Any]]:
        """Send journal rows again from their stored text ((seq, text, sound, marked) as
        ``ISessionStore.replayRows`` gives them, marked by ``REPLAY_MARKS``); the updates
        that had to be decoded."""

    def whenWritable() -> Deferred[None]:
        """A Deferred that fires once the editor has caught up (at once if it has)."""


class ISessionOptions(Interface):
    """The one owner of a session's settings (mode, model, config options, thought
    level) and of its engine agent. Called in the reactor thread."""

    def agentFor(state: SessionState) -> IEngineAgent:
        """The session's engine agent, built when first needed (or anew after its
        folders changed)."""

    def foldersChanged(state: SessionState) -> None:
        """The session moved to other folders: its next turn gets a new agent."""

    def setMode(state: SessionState, mode: str, announce: bool = True) -> None:
        """Switch the mode (checked), save it, and tell the editor unless ``announce`` is false."""

    def setModel(state: SessionState, model: str, announce: bool = True) -> None:
        """Switch the model for the next request on; history and tools stay."""

    def setOption(state: SessionState, configId: str, value: object) -> None:
        """Set any config option (checked: -32602 for a bad one)."""

    def configOptions(state: SessionState) -> list[dict[str, Any]]:
        """The session's config options, current values included."""

    def announceMode(state: SessionState) -> None:
        """Send the current mode."""

    def announceOptions(state: SessionState) -> None:
        """Send the current config options."""

    def forget(state: SessionState) -> None:
        """The session is gone: drop its agent."""


class ISessionStore(Interface):
    """Sessions in memory and on disk. Called in the reactor thread; disk work
    happens off it. Methods that touch the disk return an awaitable (a
    coroutine or a Deferred)."""

    sessions = Attribute("The live sessions: a dict of session id to state.")
    onForget = Attribute("Called with a session's state when it is dropped from memory (or None).")
    onStorage = Attribute("Called with a session's state, a severity, a title and a description when its "
                          "work could not be saved, and when it is (or None).")

    def create(cwd: str, additionalDirectories: list[str], **settings: Any) -> Awaitable[SessionState]:
        """A new session; ``settings`` are initial state fields (e.g. ``model``)."""

    def get(sessionId: str) -> Awaitable[SessionState]:
        """The session's state, loaded from disk if needed; fails with
        ResourceNotFound for an unknown id."""

    def remove(sessionId: str) -> Awaitable[None]:
        """Forget it in memory and delete it from disk."""

    def fork(sessionId: str, cwd: str, additionalDirectories: list[str]) -> Awaitable[SessionState]:
        """A deep copy under a new id."""

    def list(cwd: str | None, cursor: str | None) -> Awaitable[tuple[list[SessionRecord], str | None]]:
        """The records of one page, newest first, and the cursor of the next (or None);
        only sessions with a conversation (a title or messages)."""

    def forget(state: SessionState) -> Deferred[Any]:
        """Drop one session from memory; fires once its journal is written."""

    def save(state: SessionState, touch: bool = True) -> Deferred[Any]:
        """Persist the session's settings (title, model, mode, config, cwd)."""

    def journalUpdate(state: SessionState, update: dict[str, Any]) -> None:
        """Remember an update sent to the editor, for replay on ``session/load``."""

    def replay(state: SessionState) -> Awaitable[tuple[JournalTail, list[dict[str, Any]]]]:
        """The journal rows to replay, and the updates kept in memory that follow them."""

    def replayRows(
        state: SessionState, after: int, last: int, marks: tuple[str, ...] = ()
    ) -> Awaitable[list[tuple[int, bytes, bool, bool]]]:
        """The journal's next rows after seq ``after`` up to ``last``, a batch: (seq, the
        update's JSON text, whether it is sound as stored, whether its structure holds one
        of ``marks``; ``SessionDB.journalTexts``)."""

    def warm() -> None:
        """Open the store in the background, before the first session needs it."""

    def beginTurn(state: SessionState, prompt: str | None = None) -> Awaitable[None]:
        """Mark a prompt turn as running in this process; ``prompt`` (for a turn of the
        model) makes it one ``/rewind`` can cut back to."""

    def turns(state: SessionState) -> Awaitable[list[tuple[int, int | None, str, str]]]:
        """The prompt turns a rewind can name: (turn, start in the history or None, prompt, began)."""

    def rewind(state: SessionState, turn: int) -> Awaitable[list[int]]:
        """Cut the conversation back to before prompt turn ``turn``; the turns cut."""

    def endTurn(state: SessionState, messages: list[dict[str, Any]],
                history: list[dict[str, Any]] | None = None, asides: list[dict[str, Any]] = ()) -> Awaitable[None]:
        """Make the finished turn durable (journal, new messages, idle state); with
        ``history`` (after a compaction) that is the model's history from now on. ``asides``
        (subagents' messages) are kept searchable, outside the model's history."""

    def replaceHistory(state: SessionState, messages: list[dict[str, Any]]) -> Awaitable[None]:
        """Replace the conversation the model sees."""

    def searchNow(query: str, limit: int, cwd: str | None = None) -> list[dict[str, Any]]:
        """Full-text search over stored messages; blocks, so only from a worker thread.
        ``cwd`` keeps the sessions in that folder or below it (one project); None, all."""

    def close() -> Deferred[None]:
        """Flush every journal and close the database (at shutdown)."""
