"""The real process, through every entry point: clean stdout, errors, big lines, exit."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap

from twisted.trial.unittest import SynchronousTestCase

from hermes_acp import __version__

from . import acpschema
from .agentproc import ENTRY_POINTS, LiveAgent, agentEnv, frame, initialize, runAgent

MiB = 1024 * 1024


def assertValidStream(testCase: SynchronousTestCase, requests: list[bytes], frames: list[dict]) -> None:
    """Every frame validates against the ACP schema and uses only its key names."""
    methods = {}
    for line in b"".join(requests).splitlines():
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(message, dict) and "id" in message and "method" in message:
            methods[json.dumps(message["id"])] = message["method"]
    for f in frames:
        testCase.assertEqual(acpschema.checkAgentFrame(f, methods), [], f)


class EntryPointTests(SynchronousTestCase):
    def test_initializeThroughEveryEntryPoint(self) -> None:
        """Each entry point answers initialize with a schema-valid result, keeps stdout
        to protocol frames (twist logs to stdout by default) and exits 0 on EOF."""
        for name, argv in ENTRY_POINTS.items():
            requests = [initialize(0, clientInfo={"name": "test", "version": "1"})]
            run = runAgent(requests, argv=argv)
            self.assertEqual(run.returncode, 0, (name, run.stderr[-2000:]))
            frames = run.frames()
            self.assertEqual(len(frames), 1, name)
            result = frames[0]["result"]
            self.assertEqual(result["protocolVersion"], 1)
            self.assertEqual(result["agentInfo"], {"name": "hermes-acp", "title": "Hermes ACP", "version": __version__})
            assertValidStream(self, requests, frames)

    def test_versionFlag(self) -> None:
        """--version prints the package version under every entry point."""
        for name, argv in ENTRY_POINTS.items():
            out = subprocess.run(argv + ["--version"], capture_output=True, env=agentEnv(), timeout=60)
            self.assertEqual(out.returncode, 0, name)
            self.assertEqual(out.stdout.decode().strip(), f"hermes-acp {__version__}", name)

    def test_unknownOptionIsUsageError(self) -> None:
        """A bad option exits 64 with the usage on stderr and nothing on stdout."""
        out = subprocess.run(ENTRY_POINTS["hermes-acp"] + ["--bogus"], capture_output=True, env=agentEnv(), timeout=60)
        self.assertEqual(out.returncode, 64)
        self.assertEqual(out.stdout, b"")
        self.assertIn(b"bogus", out.stderr)


class StdoutTests(SynchronousTestCase):
    def test_strayWritesGoToStderr(self) -> None:
        """print, a raw write to fd 1 and a child's output during serving land on
        stderr; a child reading stdin gets EOF, not protocol bytes."""
        script = textwrap.dedent(
            """
            import os, subprocess, sys
            import hermes_acp.acp as acp
            original = acp.ACPServer.initialize
            def noisy(self, params):
                print("STRAY-PRINT", flush=True)
                os.write(1, b"STRAY-RAW\\n")
                subprocess.run(["echo", "STRAY-CHILD"])
                stolen = subprocess.run(["cat"], capture_output=True, timeout=5).stdout
                sys.stderr.write("child read %d bytes of stdin\\n" % len(stolen))
                return original(self, params)
            acp.ACPServer.initialize = noisy
            from hermes_acp.cli import main
            main([])
            """
        )
        requests = [initialize(0), initialize(1), initialize(2)]
        run = runAgent(requests, argv=[sys.executable, "-c", script])
        self.assertEqual(run.returncode, 0, run.stderr[-2000:])
        self.assertEqual(sorted(f["id"] for f in run.frames()), [0, 1, 2])
        for marker in (b"STRAY-PRINT", b"STRAY-RAW", b"STRAY-CHILD"):
            self.assertNotIn(marker, run.stdout)
            self.assertIn(marker, run.stderr)
        self.assertIn(b"child read 0 bytes of stdin", run.stderr)


class SecretTests(SynchronousTestCase):
    def test_secretsNeverReachTheLog(self) -> None:
        """Under every entry point, even at debug level and with twist's own log
        observer, a secret from the environment is logged as [REDACTED]."""
        secret = "sk-test-supersecret-0123456789"
        requests = [initialize(0), frame(secret, {}), frame(secret, {}, 1)]
        for name, argv in ENTRY_POINTS.items():
            if name == "twist hermes-acp":
                argv = [argv[0], "--log-level", "debug", argv[1]]
            else:
                argv = argv + ["--log-level", "debug"]
            run = runAgent(requests, argv=argv, env=agentEnv(HERMES_API_KEY=secret))
            self.assertEqual(run.returncode, 0, name)
            self.assertNotIn(secret.encode(), run.stderr, name)
            self.assertIn(b"REDACTED", run.stderr, name)


class BadInputTests(SynchronousTestCase):
    def test_everyBadInputGetsItsErrorAndServingGoesOn(self) -> None:
        """Malformed JSON, batches, unknown methods, bad params, invalid UTF-8 and auth
        failures each get their JSON-RPC error; the process keeps answering."""
        requests = [
            initialize(0),
            b"{not json\n",
            b'[{"jsonrpc":"2.0","id":9,"method":"initialize"}]\n',
            frame("no/such/method", {}, "u"),
            frame("_vendor.example/thing", {"_meta": {"x": 1}}, 5),
            frame("initialize", {"clientCapabilities": {}}, 6),
            frame("initialize", {"protocolVersion": "one"}, 7),
            frame("_vendor.example/notice", {}),
            b"\xff\xfe\xfd\n",
            b"\r\n\n",
            frame("authenticate", {"methodId": "nope"}, 10),
            frame("authenticate", {"methodId": "hermes-setup"}, 11),
            initialize(12, protocolVersion=65535, _meta={"traceparent": "00-x"}),
        ]
        run = runAgent(requests)
        self.assertEqual(run.returncode, 0)
        frames = run.frames()
        assertValidStream(self, requests, frames)
        got = [(f["id"], f["error"]["code"] if "error" in f else "ok") for f in frames]
        self.assertEqual(
            got,
            [(0, "ok"), (None, -32700), (None, -32600), ("u", -32601), (5, -32601), (6, -32602),
             (7, -32602), (None, -32700), (10, -32602), (11, -32000), (12, "ok")],
        )
        self.assertIn("protocolVersion", frames[5]["error"]["message"])
        self.assertIn("hermes-acp --setup", frames[9]["error"]["message"])
        self.assertEqual(frames[10]["result"]["protocolVersion"], 1)


class LargeLineTests(SynchronousTestCase):
    def test_largeLinesWork(self) -> None:
        """20 MiB and 60 MiB requests (under the 64 MiB default) are read and answered."""
        for size in (20, 60):
            big = initialize(1, clientInfo={"name": "x" * (size * MiB), "version": "1"})
            run = runAgent([big, initialize(2)], timeout=120)
            self.assertEqual(run.returncode, 0)
            self.assertEqual([f.get("id") for f in run.frames()], [1, 2], size)
            self.assertNotIn("error", run.frames()[0])

    def test_seventyMiBLineIsRefusedAndServingGoesOn(self) -> None:
        """A 70 MiB line (over the 64 MiB default) gets -32600 with id null; the
        next request is answered."""
        huge = initialize(1, clientInfo={"name": "y" * (70 * MiB), "version": "1"})
        run = runAgent([initialize(0), huge, initialize(2)], timeout=120)
        self.assertEqual(run.returncode, 0)
        got = [(f["id"], f.get("error", {}).get("code")) for f in run.frames()]
        self.assertEqual(got, [(0, None), (None, -32600), (2, None)])

    def test_limitIsConfigurable(self) -> None:
        """HERMES_ACP_MAX_LINE lowers the limit."""
        padded = initialize(1, clientInfo={"name": "z" * 5000, "version": "1"})
        run = runAgent([padded, initialize(2)], env=agentEnv(HERMES_ACP_MAX_LINE="4096"))
        got = [(f["id"], f.get("error", {}).get("code")) for f in run.frames()]
        self.assertEqual(got, [(None, -32600), (2, None)])


class ShutdownTests(SynchronousTestCase):
    def test_eofExitsPromptly(self) -> None:
        """Closing stdin ends the process with status 0, well before the 15 s shutdown deadline."""
        for name, argv in ENTRY_POINTS.items():
            agent = LiveAgent(argv)
            try:
                agent.send(initialize(0))
                self.assertEqual(agent.readFrame()["id"], 0)
                code = agent.closeStdinAndWait(timeout=10)
            finally:
                agent.kill()
            self.assertEqual(code, 0, name)

    def test_eofRightAfterJournaledUpdates(self) -> None:
        """EOF moments after updates were journaled (before the periodic flush) still
        exits at once: the journal is flushed on a database thread that is still running."""
        env = agentEnv(HERMES_BASE_URL="http://127.0.0.1:9/v1", HERMES_MODEL="m")
        for _ in range(3):
            agent = LiveAgent(env=env)
            try:
                agent.send(initialize(0))
                agent.readFrame()
                agent.send(frame("session/new", {"cwd": "/", "mcpServers": []}, 1))
                sessionId = agent.readFrame()["result"]["sessionId"]
                prompt = [{"type": "text", "text": "/title Saved at the last moment"}]
                agent.send(frame("session/prompt", {"sessionId": sessionId, "prompt": prompt}, 2))
                while agent.readFrame().get("id") != 2:
                    pass
                code = agent.closeStdinAndWait(timeout=10)
            finally:
                agent.kill()
            self.assertEqual(code, 0)
            load = frame("session/load", {"sessionId": sessionId, "cwd": "/", "mcpServers": []}, 1)
            replayed = runAgent([initialize(0), load], env=env).frames()
            kinds = [f["params"]["update"]["sessionUpdate"] for f in replayed if f.get("method") == "session/update"]
            self.assertIn("session_info_update", kinds)  # the journal was written before exit

    def test_idleExitIsQuiet(self) -> None:
        """An agent that only opened a session (its engine imported for ``initialize``, its
        database opening on its thread) and then sees EOF says nothing about busy threads at exit."""
        env = agentEnv(HERMES_BASE_URL="http://127.0.0.1:9/v1", HERMES_MODEL="m", HERMES_MODELS="m")
        run = runAgent([initialize(0), frame("session/new", {"cwd": "/", "mcpServers": []}, 1)], env=env)
        self.assertEqual(run.returncode, 0)
        self.assertNotIn(b"still busy", run.stderr)
        self.assertNotIn(b"Traceback", run.stderr)

    def test_sigtermAndSigintExit(self) -> None:
        """SIGTERM and SIGINT stop the console entry point with status 0 at once.

        This test used to hang its SIGINT case whenever the suite itself ran as a
        background job of a script (CI): such jobs start with SIGINT ignored, the
        agent inherited that, and Twisted leaves an ignored SIGINT ignored. The agent
        now installs its own handlers; the next test pins that case down."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            agent = LiveAgent(ENTRY_POINTS["hermes-acp"])
            try:
                agent.send(initialize(0))
                agent.readFrame()
                agent.process.send_signal(sig)
                code = agent.process.wait(10)
            finally:
                agent.kill()
            self.assertEqual(code, 0, sig)

    def test_signalsEndItEvenWhenStartedIgnoringSIGINT(self) -> None:
        """Started with SIGINT ignored (a script's background job, nohup), every entry
        point still ends on SIGINT and on SIGTERM (the console scripts with status 0;
        twist re-raises the signal, as it does by design)."""
        for name, argv in ENTRY_POINTS.items():
            for sig in (signal.SIGINT, signal.SIGTERM):
                agent = LiveAgent(argv, preexec=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
                try:
                    agent.send(initialize(0))
                    agent.readFrame()
                    agent.process.send_signal(sig)
                    code = agent.process.wait(10)
                finally:
                    agent.kill()
                expected = (-sig, 128 + sig) if name == "twist hermes-acp" else (0,)
                self.assertIn(code, expected, (name, sig))

    def test_clientClosesOurStdoutFirst(self) -> None:
        """A client that closes the agent's stdout (its read end) before stdin, as
        toad does on quit: the agent exits by itself, leaving no orphan, whether or
        not stdin closes afterwards."""
        for closeStdin in (False, True):
            agent = LiveAgent(ENTRY_POINTS["hermes-acp"])
            try:
                agent.send(initialize(0))
                agent.readFrame()
                agent.process.stdout.close()  # type: ignore[union-attr]
                if closeStdin:
                    agent.process.stdin.close()  # type: ignore[union-attr]
                code = agent.process.wait(10)
            finally:
                agent.kill()
            self.assertEqual(code, 0, closeStdin)

    def test_eofWhileTheClientIsNotReading(self) -> None:
        """stdin EOF from a client that stopped reading our answers (a full stdout
        pipe, so the agent also stopped reading): the agent still exits, without
        waiting for anyone to read."""
        agent = LiveAgent(ENTRY_POINTS["hermes-acp"])
        try:
            stdin = agent.process.stdin.fileno()  # type: ignore[union-attr]
            os.set_blocking(stdin, False)
            requests = b"".join(initialize(n) for n in range(2000))  # about 1 MB of answers
            written = 0
            while written < len(requests) and select.select([], [stdin], [], 3.0)[1]:
                try:
                    written += os.write(stdin, requests[written : written + 4096])
                except BlockingIOError:
                    pass
            agent.process.stdin.close()  # type: ignore[union-attr]
            code = agent.process.wait(15)
        finally:
            agent.kill()
        self.assertLess(written, len(requests))  # it did stop reading
        self.assertEqual(code, 0)

    def test_halfClosedSocketStdinEndsIt(self) -> None:
        """Node-based clients give the agent socketpairs, and their stdin.end() is a
        half-close: with the client not reading (so the agent stopped reading too),
        that half-close still ends the agent."""
        import socket

        ours, theirs = socket.socketpair()
        outOurs, outTheirs = socket.socketpair()
        process = subprocess.Popen(ENTRY_POINTS["hermes-acp"], stdin=theirs.fileno(), stdout=outTheirs.fileno(),
                                   stderr=subprocess.DEVNULL, env=agentEnv())
        theirs.close()
        outTheirs.close()
        try:
            ours.setblocking(False)
            requests = b"".join(initialize(n) for n in range(4000))
            sent = 0
            while sent < len(requests) and select.select([], [ours], [], 3.0)[1]:
                try:
                    sent += ours.send(requests[sent : sent + 4096])
                except BlockingIOError:
                    pass
            ours.shutdown(socket.SHUT_WR)
            code = process.wait(15)
        finally:
            if process.poll() is None:
                process.kill()
            ours.close()
            outOurs.close()
        self.assertLess(sent, len(requests))  # it did stop reading
        self.assertEqual(code, 0)

    def test_aShutdownThatHangsStillEnds(self) -> None:
        """If something hangs during shutdown, the process still ends, with status 70
        and a line on stderr saying so."""
        script = textwrap.dedent(
            """
            from twisted.internet.defer import Deferred
            import hermes_acp.acp as acp
            acp.ACPServer.shutdown = lambda self: Deferred()  # never fires
            from hermes_acp.cli import main
            main([])
            """
        )
        process = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, env=agentEnv())
        try:
            out, err = process.communicate(initialize(0), timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
        self.assertEqual(process.returncode, 70)
        self.assertIn(b"shutdown did not finish", err)
        self.assertEqual(json.loads(out)["id"], 0)


class SettingsTests(SynchronousTestCase):
    def test_unusableSettingsAreRefusedAtStart(self) -> None:
        """A timeout of inf, nan, 0 or below, or a malformed number, stops every entry
        point at once with status 78 and a message naming the setting; --check says
        the same and exits 1."""
        bad = [("HERMES_ACP_PERMISSION_TIMEOUT", v) for v in ("inf", "nan", "-5", "0", "soon")]
        bad += [("HERMES_ACP_THREADS", "0"), ("HERMES_ACP_MAX_LINE", "10"), ("HERMES_CONTEXT_WINDOW", "lots"),
                ("HERMES_ACP_SANDBOX", "maybe"), ("HERMES_ACP_SANDBOX_NETWORK", "sometimes"),
                ("HERMES_ACP_COMMAND_CPU_SECONDS", "0"), ("HERMES_ACP_COMPACT_AT", "1.5"),
                ("HERMES_ACP_COMPACT_AT", "most")]
        for name, argv in ENTRY_POINTS.items():
            for variable, value in bad[: 2 if name != "hermes-acp" else len(bad)]:
                run = runAgent([initialize(0)], argv=argv, env=agentEnv(**{variable: value}))
                self.assertEqual(run.returncode, 78, (name, variable, value, run.stderr[-500:]))
                self.assertEqual(run.stdout, b"", name)
                self.assertIn(variable.encode(), run.stderr)
                self.assertIn(value.encode(), run.stderr)
        check = subprocess.run(ENTRY_POINTS["hermes-acp"] + ["--check"], capture_output=True, timeout=60,
                               env=agentEnv(HERMES_ACP_PERMISSION_TIMEOUT="inf"))
        self.assertEqual(check.returncode, 1)
        self.assertIn(b"HERMES_ACP_PERMISSION_TIMEOUT must be a finite number", check.stdout)
