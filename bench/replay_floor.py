"""The floor of a ``session/load`` through the editor's door: a process that answers one
request on stdin by selecting a session's journal rows and writing each row's text in a
``session/update`` frame to stdout, then the request's answer. It is read by the same client
(``bench/client.py``) over the same pipe as the agent, so a load's ratio to it is what the agent
adds to the least any agent must do: read the rows, and hand their bytes to the editor.

``python bench/replay_floor.py STATE_DB SESSION_ID``; it exits when stdin closes.
"""

from __future__ import annotations

import json
import sqlite3
import sys


def main(path: str, sessionId: str) -> None:
    try:
        from hermes_acp.migrations import JOURNAL_TEXT
    except ImportError:  # a store from before the references (to compare with)
        JOURNAL_TEXT = "j.payload"
    out, stdin = sys.stdout.buffer, sys.stdin.buffer
    head = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":' + json.dumps(sessionId).encode() + b',"update":'
    query = f"SELECT {JOURNAL_TEXT} FROM acp_journal AS j WHERE j.session_id = ? ORDER BY j.seq"
    connection = sqlite3.connect(path)
    while line := stdin.readline():
        request = json.loads(line)
        for (payload,) in connection.execute(query, (sessionId,)):
            out.write(head + (payload.encode() if isinstance(payload, str) else payload) + b"}}\n")
        out.write(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": {}}).encode() + b"\n")
        out.flush()
    connection.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
