"""Sessions have names: after the first exchange, the model's short title.

The first prompt line is the session's title at once (``Turn``); when the first turn ended
well, ``SessionNamer.ask`` sends one small request for a better one on a worker thread
(``hermes_acp.engine.titles``), after the prompt's answer, never delaying it. The title
that comes back replaces the stand-in, is shown (``session_info_update``) and saved,
unless the user named the session meanwhile (``/title`` clears ``SessionState.autoTitle``).

A session is asked once in its life: only its first turn sets the stand-in, and a loaded
session already has a title. A request that fails, takes longer than
``HERMES_ACP_TITLE_SECONDS`` or answers nothing usable changes nothing; it is routine, so
it is logged at debug. A cancel, a closed session or the end of the connection drops the
request in flight: its socket is closed, and whatever it answers is ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from .interfaces import ISessionStore, IUpdateChannel
from .session_state import SessionState
from .store import timestamp

if TYPE_CHECKING:
    from .config import Endpoint
    from .engine.cancel import Cancellation

log = Logger()


@attrs.define(eq=False)
class SessionNamer:
    """The title requests of one connection's sessions, at most one in flight per session."""

    runInWorker: Callable[..., Deferred[Any]]
    updates: IUpdateChannel
    store: ISessionStore
    #: How long one title request may take (``HERMES_ACP_TITLE_SECONDS``).
    seconds: float
    _pending: dict[str, Cancellation] = attrs.field(factory=dict)

    def ask(self, session: SessionState, endpoint: Endpoint, prompt: str, answer: str) -> None:
        """Ask for the session's title in the background."""
        from .engine.cancel import Cancellation
        from .engine.titles import suggestTitle

        self.drop(session.sessionId)
        cancellation = self._pending[session.sessionId] = Cancellation()
        model = session.model or endpoint.model or ""
        d = self.runInWorker(suggestTitle, endpoint, model, prompt, answer, cancellation, self.seconds)
        d.addBoth(self._arrived, session, cancellation)

    def _arrived(self, result: str | None | Failure, session: SessionState, cancellation: Cancellation) -> None:
        if self._pending.get(session.sessionId) is cancellation:
            del self._pending[session.sessionId]
        if cancellation.cancelled:
            log.debug("title request of session {id} dropped", id=session.sessionId)
        elif isinstance(result, Failure):
            log.debug("title request of session {id} failed: {why}", id=session.sessionId, why=result.getErrorMessage())
        elif result is None:
            log.debug("title request of session {id} gave no usable title", id=session.sessionId)
        elif not session.autoTitle:
            log.debug("title of session {id} was set meanwhile; the model's is dropped", id=session.sessionId)
        else:
            session.title, session.autoTitle = result, False
            update = {"sessionUpdate": "session_info_update", "title": result, "updatedAt": timestamp()}
            self.updates.send(session, update)
            self.store.save(session)

    def drop(self, sessionId: str) -> None:
        """Drop the session's request in flight, if any."""
        cancellation = self._pending.pop(sessionId, None)
        if cancellation is not None:
            cancellation.cancel()

    def dropAll(self) -> None:
        for cancellation in self._pending.values():
            cancellation.cancel()
        self._pending.clear()
