"""What the project publishes: the ACP registry manifest and its icon, the one version
number everything reports, and documentation that matches the code."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from jsonschema import Draft7Validator
from twisted.trial.unittest import SynchronousTestCase

from hermes_acp import __version__, headless
from hermes_acp.tap import Options

from .agentproc import ENTRY_POINTS, agentEnv, initialize, runAgent

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
MANIFEST = ROOT / "acp_registry" / "agent.json"
ICON = ROOT / "acp_registry" / "icon.svg"
SCHEMA = Path(__file__).parent / "data" / "registry-agent.schema.json"
# What the registry's CI sends before it checks authMethods (agentclientprotocol/registry,
# .github/workflows/client.py): a client that can run terminal auth.
REGISTRY_CLIENT = {
    "terminal": True,
    "fs": {"readTextFile": True, "writeTextFile": True},
    "_meta": {"terminal_output": True, "terminal-auth": True},
}


def manifest() -> dict:
    return json.loads(MANIFEST.read_text())


class ManifestTests(SynchronousTestCase):
    def test_validatesAgainstTheRegistrySchema(self) -> None:
        """No schema errors (and the schema does catch a bad id or a stray key)."""
        validator = Draft7Validator(json.loads(SCHEMA.read_text()), format_checker=Draft7Validator.FORMAT_CHECKER)
        self.assertEqual([e.message for e in validator.iter_errors(manifest())], [])
        broken = {**manifest(), "id": "Hermes ACP", "distribution": {"uvx": {"package": "x", "cmd": "x"}}}
        self.assertEqual(len(list(validator.iter_errors(broken))), 2)

    def test_matchesThePackage(self) -> None:
        """The id is the distribution name, which is not the unrelated `hermes-acp` on PyPI;
        the uvx package pins this version of it (`uvx NAME@VERSION` runs the console script of
        that name, which the distribution has), and nothing else is named."""
        project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        entry = manifest()
        self.assertEqual(project["name"], "hermes-acp-twisted")
        self.assertEqual(entry["id"], project["name"])
        self.assertEqual(entry["version"], __version__)
        self.assertEqual(entry["distribution"], {"uvx": {"package": f"{project['name']}@{__version__}"}})
        self.assertEqual(project["scripts"][project["name"]], project["scripts"]["hermes-acp"])
        self.assertEqual(entry["license"], project["license"])

    def test_iconIsSixteenSquareAndMonochrome(self) -> None:
        """16x16, and every fill and stroke is currentColor, none or inherit."""
        svg = ElementTree.parse(ICON).getroot()
        self.assertEqual((svg.get("width"), svg.get("height"), svg.get("viewBox")), ("16", "16", "0 0 16 16"))
        paints = [value for element in svg.iter() for name, value in element.attrib.items() if name in ("fill", "stroke")]
        self.assertTrue(paints)
        self.assertEqual(set(paints) - {"currentColor", "none", "inherit"}, set())
        self.assertNotIn("style", "".join(str(element.attrib) for element in svg.iter()))

    def test_registryAuthCheck(self) -> None:
        """The registry's live check passes: with its client capabilities, even an
        unconfigured agent offers a terminal auth method (the setup dialogue)."""
        run = runAgent([initialize(0, clientCapabilities=REGISTRY_CLIENT)], env=agentEnv())
        methods = run.frames()[0]["result"]["authMethods"]
        terminal = [m for m in methods if m.get("type") in ("terminal", "agent")]
        self.assertEqual([(m["type"], m["args"]) for m in terminal], [("terminal", ["--setup"])])


class VersionTests(SynchronousTestCase):
    def test_oneVersionEverywhere(self) -> None:
        """--version, initialize's agentInfo, the manifest and the newest CHANGELOG entry agree."""
        out = subprocess.run(ENTRY_POINTS["hermes-acp"] + ["--version"], capture_output=True, text=True,
                             env=agentEnv(), timeout=60)
        self.assertEqual(out.stdout.strip(), f"hermes-acp {__version__}")
        info = runAgent([initialize(0)]).frames()[0]["result"]["agentInfo"]
        self.assertEqual(info["version"], __version__)
        self.assertEqual(manifest()["version"], __version__)
        releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", (ROOT / "CHANGELOG.md").read_text(), re.M)
        self.assertEqual(releases[0], __version__)


def fencedBlocks(path: Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", path.read_text(), re.M | re.S)


def anchor(heading: str) -> str:
    """GitHub's id for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


class DocsTests(SynchronousTestCase):
    def test_editorSnippetsAreValidJSON(self) -> None:
        """Every JSON block of the guide parses; each agent_servers entry (Zed, JetBrains)
        runs hermes-acp with args and env of the right types."""
        entries = []
        for path in (DOCS / "getting-started.md", ROOT / "README.md"):
            for block in fencedBlocks(path, "json"):
                value = json.loads(block)
                entries += list(value.get("agent_servers", {}).values())
        self.assertEqual(len(entries), 3)  # Zed and JetBrains in the guide, Zed in the README
        for entry in entries:
            self.assertEqual(entry["command"], "hermes-acp")
            self.assertEqual((entry["args"], entry["env"]), ([], {}))
        self.assertEqual(sum(entry.get("type") == "custom" for entry in entries), 2)
        for block in fencedBlocks(DOCS / "troubleshooting.md", "json"):
            json.loads(block)

    def test_everySettingIsDocumented(self) -> None:
        """The variables the code reads are the ones configuration.md lists, no more, no fewer."""
        pattern = r"\b((?:HERMES|OPENAI|OPENROUTER|NOUS)_[A-Z0-9_]+)\b"
        read = set()
        for source in (ROOT / "hermes_acp").rglob("*.py"):
            read |= set(re.findall(rf'"{pattern}"', source.read_text()))
        table = re.findall(rf"^\| `{pattern}` \|", (DOCS / "configuration.md").read_text(), re.M)
        self.assertEqual(set(table), read)
        self.assertIn("HERMES_CONTEXT_WINDOW", read)

    def test_everyOptionIsDocumented(self) -> None:
        text = (DOCS / "configuration.md").read_text()
        for options in (Options, headless.PromptOptions):
            for name, *_ in options.optFlags + options.optParameters:
                self.assertIn(f"`--{name}", text, name)

    def test_exitCodesAreDocumented(self) -> None:
        text = (DOCS / "troubleshooting.md").read_text()
        codes = {value for name, value in vars(headless).items() if name.startswith("EXIT_")}
        documented = {int(code) for code in re.findall(r"^\| (\d+) \|", text, re.M)}
        self.assertEqual(documented, codes)
        for stop, code in headless.STOP_CODES.items():
            self.assertRegex(text, rf"\| {code} \|.*`{stop}`" if stop != "cancelled" else rf"\| {code} \| cancelled")

    def test_linksResolve(self) -> None:
        """Relative links point at files that exist, and #anchors at headings in them."""
        for page in [ROOT / "README.md", *DOCS.glob("*.md")]:
            for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
                if re.match(r"[a-z]+:", target):
                    continue
                path, _, fragment = target.partition("#")
                resolved = (page.parent / path).resolve() if path else page
                self.assertTrue(resolved.exists(), f"{page.name}: {target}")
                if fragment:
                    headings = re.findall(r"^#+ (.*)$", resolved.read_text(), re.M)
                    self.assertIn(fragment, [anchor(h) for h in headings], f"{page.name}: {target}")
