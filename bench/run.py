"""Benchmark the installed hermes-acp agent against a scripted model server.

    python bench/run.py [--quick] [--only initialize,turn,...] [--write-docs]

Starts ``bench/model_server.py`` (the scripted OpenAI-compatible server of
``tests/scripted_model.py``) in its own process, drives ``python -m
hermes_acp`` over stdio with a raw NDJSON client, and prints one Markdown
table of medians. ``--write-docs`` puts the same table, with the machine and
date, into docs/performance.md. It stops by itself: runs are counted and every
wait has a timeout. Speed is reported here, never asserted by tests.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cases import CASES, SCRIPT, Bench, Result, Runs, makeRoot, removeRoot
from bench.client import ModelServer
from bench.report import loadAverage, now, render, writeDocs

DOCS = Path(__file__).resolve().parent.parent / "docs" / "performance.md"
#: The whole run stops after this many seconds, whatever happens.
DEADLINE = {True: 180.0, False: 900.0}


async def runCases(names: list[str], runs: Runs, keep: bool) -> tuple[list[Result], list[str]]:
    server = await ModelServer.start(SCRIPT)
    root = makeRoot()
    bench = Bench(server, runs, root)
    results: list[Result] = []
    failures: list[str] = []
    try:
        for name in names:
            started = time.perf_counter()
            try:
                results += await CASES[name](bench)
            except Exception as e:  # noqa: BLE001 - report it and go on with the other cases
                failures.append(f"{name}: {type(e).__name__}: {e}")
            finally:
                await bench.cleanup()
            print(f"[bench] {name}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    finally:
        await bench.cleanup()
        await server.stop()
        if bench.killed:
            failures.append(f"{bench.killed} agent(s) did not exit within 5 s of stdin EOF and were killed")
        if keep:
            print(f"[bench] agent homes and logs kept in {root}", file=sys.stderr)
        else:
            removeRoot(root)
    return results, failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs per measure (well under a minute)")
    parser.add_argument("--only", help=f"comma-separated cases: {', '.join(CASES)}")
    parser.add_argument("--write-docs", action="store_true", help=f"write the table into {DOCS.name}")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder with the agents' stderr logs")
    options = parser.parse_args(argv)
    names = options.only.split(",") if options.only else list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    when, startLoad = now(), loadAverage()
    try:
        results, failures = asyncio.run(
            asyncio.wait_for(runCases(names, Runs.forMode(options.quick), options.keep), DEADLINE[options.quick])
        )
    except TimeoutError:
        print(f"[bench] gave up after {DEADLINE[options.quick]:g} s", file=sys.stderr)
        return 2
    mode = (" --quick" if options.quick else "") + (f" --only {options.only}" if options.only else "")
    block = render(results, mode, when, (startLoad, loadAverage()))
    print(block)
    for failure in failures:
        print(f"[bench] FAILED {failure}", file=sys.stderr)
    if options.write_docs and not failures:
        writeDocs(DOCS, block)
        print(f"[bench] wrote {DOCS}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
