"""Who decides before ``web_extract`` fetches from a host: the session's mode, or the user.

Fetching is a read, of something outside the workspace; it follows the read rule of
``engine.access``: ``dont_ask`` fetches without asking, every other mode (``default``,
``accept_edits``, and ``plan``, where reads are allowed as in ``default``) asks about each host
before the first request to it. "Allow always" allows the host for the rest of the session,
"reject always" refuses it for the rest of the session; "allow once" allows this call's
requests to it. A redirect to another host asks about that host too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import attrs

from hermes_acp.engine.access import PathApprovals
from hermes_acp.engine.approval import ALLOW_ALWAYS, ALLOWED, REJECT_ALWAYS, Verdict, ask, refusal


@attrs.define(eq=False)
class HostApprovals:
    """One session's fetch policy, and the hosts the user answered "always" about.

    The mode is the one ``PathApprovals`` holds (one home for the session's mode)."""

    paths: PathApprovals
    allowedHosts: set[str] = attrs.field(factory=set)
    refusedHosts: set[str] = attrs.field(factory=set)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, repr=False)

    def decide(self, url: str, host: str, question: Callable[[str, str], str] | None) -> Verdict:
        """Allow fetching ``url`` from ``host``, or ask ``question(url, reason)``."""
        with self._lock:
            if host in self.refusedHosts:
                return Verdict(False, f"Fetch refused: the user refused fetching from {host} for the rest of "
                                      "the session; nothing was fetched.")
            if self.paths.mode == "dont_ask" or host in self.allowedHosts:
                return Verdict(True)
        reason = f"fetches a web page from {host}"
        answer = ask(question, url, reason)
        with self._lock:
            if answer == ALLOW_ALWAYS:
                self.allowedHosts.add(host)
            elif answer == REJECT_ALWAYS:
                self.refusedHosts.add(host)
        if answer in ALLOWED:
            return Verdict(True)
        return Verdict(False, f"Fetch not approved ({refusal(answer)}); nothing was fetched from {host}.")
