"""The scripted model server for the benchmark, in its own process.

It is ``tests/scripted_model.py`` (same script format, same first stdout line:
the base URL) plus one thing the benchmark needs across the process boundary:
each chat request is announced on stdout as a JSON line
``{"request": "<latest user message>"}`` the moment it arrives, so the
benchmark knows when the agent's model call is in flight (cancel latency).

    python bench/model_server.py --script FILE.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.scripted_model import ScriptedModel, latestUserText, listen


class AnnouncingModel(ScriptedModel):
    """A ``ScriptedModel`` that reports every chat request on stdout."""

    def render_POST(self, request: Any) -> Any:
        answer = super().render_POST(request)
        if self.requests and self.requests[-1].path.endswith("/chat/completions"):
            text = latestUserText(self.requests[-1].body or {})
            sys.stdout.write(json.dumps({"request": text[:200]}) + "\n")
            sys.stdout.flush()
        return answer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--script", required=True, help="JSON file with default/rules/models/repeat")
    options = parser.parse_args(argv)
    with open(options.script) as f:
        spec = json.load(f)
    from twisted.internet import reactor

    model = AnnouncingModel.fromJSON(spec)
    _, url = listen(model, reactor)
    sys.stdout.write(url + "\n")
    sys.stdout.flush()
    reactor.run()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
