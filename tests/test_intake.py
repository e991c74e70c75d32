"""Prompt intake: ACP content blocks → the user message the model reads."""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
from typing import Any
from urllib.parse import quote

from twisted.trial.unittest import SynchronousTestCase

from hermes_acp.intake import MAX_INLINE, checkPrompt, promptText, toModelContent
from hermes_acp.jsonrpc import InvalidParams

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + b"\x00" * 20


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def link(uri: str, name: str = "file", **more: Any) -> dict[str, Any]:
    return {"type": "resource_link", "uri": uri, "name": name, **more}


def embedded(**resource: Any) -> dict[str, Any]:
    return {"type": "resource", "resource": resource}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class FolderMixin:
    def folder(self) -> str:
        path = tempfile.mkdtemp(prefix="intake-")
        self.addCleanup(shutil.rmtree, path)  # type: ignore[attr-defined]
        return path

    def file(self, name: str, data: bytes) -> str:
        path = os.path.join(self.folder(), name)
        with open(path, "wb") as f:
            f.write(data)
        return path


class ContentTests(FolderMixin, SynchronousTestCase):
    def test_textOnlyIsOneString(self) -> None:
        """Text blocks join into one string (the form slash commands and old models need)."""
        self.assertEqual(toModelContent([text("hello"), text("world")]), "hello\n\nworld")
        self.assertEqual(toModelContent([text("/help")]), "/help")

    def test_imageMakesMultimodalParts(self) -> None:
        """An image turns the message into parts, the image as a data URL."""
        content = toModelContent([text("what is this?"), {"type": "image", "data": b64(PNG), "mimeType": "image/png"}])
        self.assertEqual(
            content,
            [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}},
            ],
        )

    def test_linkedFileIsInlinedWithHeader(self) -> None:
        """A file:// link to a local file is read and inlined under a header naming it."""
        path = self.file("notes file.txt", "café\nline 2\n".encode())
        uri = "file://" + quote(path)
        self.assertEqual(
            toModelContent([text("summarise"), link(uri, "notes file.txt")]),
            f"summarise\n\n[Attached file: notes file.txt]\nURI: {uri}\n\ncafé\nline 2\n",
        )
        localhost = "file://localhost" + quote(path)
        self.assertIn("café\nline 2", toModelContent([link(localhost)]))

    def test_bareAbsolutePathAndTitle(self) -> None:
        """A bare absolute path works too; the title, when given, labels the file."""
        path = self.file("a.py", b"\xef\xbb\xbfprint(1)\n")
        self.assertEqual(
            toModelContent([link(path, "a.py", title="Entry point")]),
            f"[Attached file: Entry point]\nURI: {path}\n\nprint(1)\n",
        )

    def test_bigFileTruncatedWithNote(self) -> None:
        """A file over 512 KiB is cut to its first 512 KiB, and the header says so."""
        data = b"x" * (MAX_INLINE + 1)
        path = self.file("big.log", data)
        content = toModelContent([link(path, "big.log")])
        header, body = content.split("\n\n", 1)
        self.assertIn(f"(truncated to the first {MAX_INLINE} of {MAX_INLINE + 1} bytes)", header)
        self.assertEqual(body, "x" * MAX_INLINE)

    def test_exactly512KiBIsWhole(self) -> None:
        """A file of exactly 512 KiB is inlined whole, without a truncation note."""
        path = self.file("edge.txt", b"y" * MAX_INLINE)
        content = toModelContent([link(path, "edge.txt")])
        self.assertNotIn("truncated", content)
        self.assertTrue(content.endswith("\n\n" + "y" * MAX_INLINE))

    def test_cutInsideACharacterIsStillText(self) -> None:
        """When the 512 KiB cut falls inside a multi-byte character, the file is still text
        (the split character is left out), not "binary"."""
        data = b"a" + "é".encode() * MAX_INLINE  # the cut falls between é's two bytes
        path = self.file("wide.txt", data)
        content = toModelContent([link(path, "wide.txt")])
        self.assertNotIn("binary", content)
        body = content.split("\n\n", 1)[1]
        self.assertEqual(body, "a" + "é" * ((MAX_INLINE - 1) // 2))
        blob = toModelContent([embedded(uri="file:///w/wide.txt", blob=b64(data), mimeType="text/plain")])
        self.assertEqual(blob.split("\n\n", 1)[1], body)

    def test_brokenUTF8InAWholeFileIsBinary(self) -> None:
        """A whole file that ends inside a character (or is not UTF-8) is noted, not inlined."""
        for data in ("é".encode()[:1], b"caf\xe9 latin-1"):
            path = self.file("odd.txt", data)
            self.assertIn(f"(binary file of {len(data)} bytes; not inlined)", toModelContent([link(path, "odd.txt")]))

    def test_binaryFileNoted(self) -> None:
        """A binary file (NUL bytes) is named and sized, not inlined."""
        path = self.file("app.bin", b"\x7fELF\x00\x01\x02" * 10)
        self.assertEqual(
            toModelContent([link(path, "app.bin")]),
            f"[Attached file: app.bin]\nURI: {path}\n(binary file of 70 bytes; not inlined)",
        )

    def test_missingFileIsANote(self) -> None:
        """A file that cannot be read is a note in the message, never an exception."""
        missing = os.path.join(self.folder(), "gone.txt")
        content = toModelContent([text("look"), link("file://" + missing, "gone.txt")])
        self.assertEqual(
            content, f"look\n\n[Attached file: gone.txt]\nURI: file://{missing}\n(could not be read: No such file or directory)"
        )
        folder = self.folder()
        self.assertIn("could not be read", toModelContent([link(folder, "dir")]))

    def test_nonFileURIsAreNoted(self) -> None:
        """Web links, other hosts' files and relative paths are named, not fetched."""
        for uri in ("https://example.com/a.txt", "file://otherhost/etc/passwd", "file:etc/passwd", "relative/path.txt"):
            self.assertEqual(
                toModelContent([link(uri, "thing")]), f"[Linked resource: thing]\nURI: {uri}\n(not a local file, so not read)"
            )

    def test_linkedImage(self) -> None:
        """A linked image (by suffix or mimeType) is sent as an image; too big, it is only noted."""
        path = self.file("shot.PNG", PNG)
        self.assertEqual(
            toModelContent([link(path, "shot.PNG")]),
            [
                {"type": "text", "text": f"[Attached image: shot.PNG]\nURI: {path}"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}},
            ],
        )
        typed = self.file("shot", PNG)
        parts = toModelContent([link(typed, "shot", mimeType="image/webp")])
        self.assertEqual(parts[1]["image_url"]["url"], f"data:image/webp;base64,{b64(PNG)}")
        huge = self.file("huge.png", PNG + b"\x00" * MAX_INLINE)
        self.assertIn("binary file", toModelContent([link(huge, "huge.png")]))

    def test_embeddedText(self) -> None:
        """An embedded text resource is inlined, labelled by its file name."""
        content = toModelContent([text("fix"), embedded(uri="file:///w/src/app.py", text="x = 1\n", mimeType="text/x-python")])
        self.assertEqual(content, "fix\n\n[Attached file: app.py]\nURI: file:///w/src/app.py\n\nx = 1\n")

    def test_embeddedBigTextCutOnACharacter(self) -> None:
        """A big embedded text is cut to 512 KiB of UTF-8 without splitting a character."""
        body = "é" * MAX_INLINE
        content = toModelContent([embedded(uri="mem://doc", text=body)])
        header, shown = content.split("\n\n", 1)
        self.assertIn(f"(truncated to the first {MAX_INLINE} of {2 * MAX_INLINE} bytes)", header)
        self.assertEqual(shown, "é" * (MAX_INLINE // 2))

    def test_embeddedImageBlob(self) -> None:
        """An embedded image blob becomes an image part."""
        content = toModelContent([embedded(uri="file:///w/a.png", blob=b64(PNG), mimeType="image/png")])
        self.assertEqual(
            content,
            [
                {"type": "text", "text": "[Attached image: a.png]\nURI: file:///w/a.png"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}},
            ],
        )

    def test_embeddedOtherBlobs(self) -> None:
        """A text blob is decoded and inlined; a binary blob is noted."""
        self.assertEqual(
            toModelContent([embedded(uri="file:///w/n.txt", blob=b64("héllo".encode()))]),
            "[Attached file: n.txt]\nURI: file:///w/n.txt\n\nhéllo",
        )
        self.assertEqual(
            toModelContent([embedded(uri="file:///w/x.bin", blob=b64(b"\x00\x01"), mimeType="application/octet-stream")]),
            "[Attached file: x.bin]\nURI: file:///w/x.bin\n(binary file of 2 bytes; not inlined)",
        )

    def test_badBase64(self) -> None:
        """A blob that is not base64 is -32602, not a crash."""
        with self.assertRaises(InvalidParams) as caught:
            toModelContent([embedded(uri="file:///w/x", blob="not base64!!")])
        self.assertEqual(caught.exception.code, -32602)


class CheckPromptTests(SynchronousTestCase):
    def assertRejected(self, blocks: Any, field: str, words: str = "", image: bool = True, embedded: bool = True) -> None:
        with self.assertRaises(InvalidParams) as caught:
            checkPrompt(blocks, image=image, embedded=embedded)
        self.assertEqual(caught.exception.code, -32602)
        self.assertEqual(caught.exception.data, {"field": field})
        self.assertIn(words or field, caught.exception.message)

    def test_unsupportedTypesNamed(self) -> None:
        """An unsupported block is rejected with -32602 naming its index."""
        audio = {"type": "audio", "data": "AAAA", "mimeType": "audio/wav"}
        self.assertRejected([text("hi"), audio], "prompt[1]", "prompt[1] has type 'audio'")
        self.assertRejected([text("hi"), "nonsense"], "prompt[1]", "has type None")
        image = {"type": "image", "data": b64(PNG), "mimeType": "image/png"}
        self.assertRejected([image], "prompt[0]", "has type 'image'", image=False)
        self.assertRejected([embedded(uri="x", text="y")], "prompt[0]", "has type 'resource'", embedded=False)
        self.assertRejected({"type": "text"}, "prompt", "must be an array")

    def test_missingFields(self) -> None:
        """A block without its required fields names the field."""
        self.assertRejected([{"type": "text"}], "prompt[0].text")
        self.assertRejected([text("a"), {"type": "resource_link", "uri": "file:///x"}], "prompt[1].name")
        self.assertRejected([{"type": "image", "data": b64(PNG)}], "prompt[0].mimeType")
        self.assertRejected([{"type": "resource", "resource": "x"}], "prompt[0].resource")
        self.assertRejected([embedded(uri="file:///x")], "prompt[0].resource", "needs a text or a blob")

    def test_badBase64RejectedUpFront(self) -> None:
        """Bad base64 in an image or an embedded blob is caught before any work starts."""
        self.assertRejected([text("a"), {"type": "image", "data": "@@@", "mimeType": "image/png"}], "prompt[1].data", "not base64")
        self.assertRejected([embedded(uri="x", blob="%%%")], "prompt[0].resource.blob", "not base64")

    def test_accepts(self) -> None:
        """Valid prompts come back equal, including one made only of resources."""
        blocks = [text("a"), {"type": "image", "data": b64(PNG), "mimeType": "image/png"}, link("file:///x", "x")]
        self.assertEqual(checkPrompt(blocks, image=True, embedded=False), blocks)
        only = [embedded(uri="file:///w/a.py", text="x = 1\n"), link("https://example.com", "site")]
        self.assertEqual(checkPrompt(only, image=False, embedded=True), only)
        self.assertEqual(promptText(only), "")
        content = toModelContent(only)
        self.assertIsInstance(content, str)
        self.assertIn("x = 1", content)
        self.assertEqual(checkPrompt([], image=True, embedded=True), [])

    def test_normalizedAsTheSchemaSays(self) -> None:
        """Optional fields of the wrong type count as absent (the schema's
        x-deserialize-default-on-error), invalid audience entries are skipped, keys
        the schema does not know are dropped: what is stored and echoed is valid."""
        messy = [
            {"type": "text", "text": "a", "annotations": [1, 2], "vendorKey": {"x": 1}, "_meta": {"k": 1}},
            {"type": "resource_link", "uri": "file:///x", "name": "x", "size": "big", "title": None,
             "annotations": {"audience": ["user", "robot", 3], "priority": True, "lastModified": 5}},
            {"type": "resource", "resource": {"uri": 7, "text": "t", "extra": 1}},
        ]
        self.assertEqual(checkPrompt(messy, image=True, embedded=True), [
            {"type": "text", "text": "a", "_meta": {"k": 1}},
            {"type": "resource_link", "uri": "file:///x", "name": "x", "annotations": {"audience": ["user"]}},
            {"type": "resource", "resource": {"uri": "", "text": "t"}},
        ])

    def test_promptText(self) -> None:
        """Only the typed text counts, stripped."""
        self.assertEqual(promptText([text("  /model"), link("file:///x", "x"), text("gpt  ")]), "/model\ngpt")
