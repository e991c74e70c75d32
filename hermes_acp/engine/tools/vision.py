"""``vision_analyze``: a vision model describes an image for a model that cannot see.

Hermes' tool, with its arguments: ``image_url`` (a file path, a ``file:`` URL or a data URL)
and ``question``. The image is checked as ``read_file`` checks one (``engine.images``; a file
by ``read_file``'s path rules: the session's folders, sensitive files refused), then one
request goes to the configured vision model (``HERMES_ACP_VISION_MODEL``, on the session's
endpoint unless ``HERMES_ACP_VISION_BASE_URL`` names another) through the engine's
``ModelClient``, with the turn's reply bounds and its cancel. The result is Hermes' auxiliary
model's: ``{"success": true, "analysis": ...}``. The tool is offered only when a vision model
is configured. An http(s) URL is fetched as ``web_extract`` fetches a page: through the fetch
guard (``engine.webfetch``: no loopback or private addresses, bounded size, time and redirects)
after the session's fetch rule (``engine.webaccess``) allowed its host; at most
``HERMES_ACP_IMAGE_MAX_BYTES`` of it is read.
"""

from __future__ import annotations

import base64
import re
from urllib.parse import unquote, urlparse

import attrs

from hermes_acp.engine import images
from hermes_acp.engine.cancel import Cancellation
from hermes_acp.engine.model import CANCELLED_FINISH, ModelClient, ModelError
from hermes_acp.engine.tools.files import approvedRead, checkTextPath, loadImage
from hermes_acp.engine.tools.registry import Tool, ToolContext, ToolError, ToolOutcome, jsonText, parameters
from hermes_acp.engine.tools.webextract import hostApprover
from hermes_acp.engine.webfetch import Blocked, FetchFailed, FetchSettings, fetch

_DATA_URL = re.compile(r"^data:(image/[a-z0-9.+-]+);base64,(.*)$", re.IGNORECASE | re.DOTALL)


def _fromFile(ctx: ToolContext, path: str) -> tuple[str, str, str]:
    """An image file, by ``read_file``'s rules (asked about where a read would be)."""
    absPath = ctx.resolveReal(path)
    approvedRead(ctx, absPath)
    info = checkTextPath(absPath)
    if info is None:
        raise ToolError(f"file not found: {absPath}")
    data, picture = loadImage(ctx, absPath, info.st_size, "analysed")
    return picture.mime, base64.b64encode(data).decode("ascii"), absPath


def _fromWeb(ctx: ToolContext, url: str) -> tuple[str, str, str]:
    """An image on the web, through the fetch guard, once the session's rule allowed its host."""
    limits = ctx.imageLimits
    try:
        settings = FetchSettings.fromEnv()
        settings = attrs.evolve(settings, maxBytes=min(settings.maxBytes, limits.maxBytes))
        page = fetch(url, settings, ctx.cancelEvent, hostApprover(ctx),
                     accept="image/png,image/jpeg,image/gif,image/webp,image/*;q=0.8")
        if page.truncated:
            raise images.ImageError(f"it is larger than {settings.maxBytes} bytes, the most of an image read from "
                                    "the web (HERMES_ACP_IMAGE_MAX_BYTES and HERMES_ACP_WEB_MAX_BYTES)")
        picture = images.checked(page.body, limits)
    except (Blocked, FetchFailed, images.ImageError, ValueError) as e:
        raise ToolError(f"{url} cannot be analysed: {e}") from None
    return picture.mime, base64.b64encode(page.body).decode("ascii"), page.url


def _image(ctx: ToolContext, imageURL: str) -> tuple[str, str, str]:
    """(MIME type, base64 data, what it is) of the image ``imageURL`` names."""
    imageURL = imageURL.strip()
    match = _DATA_URL.match(imageURL)
    if match:
        data = "".join(match.group(2).split())
        try:
            picture = images.fromBase64(data, ctx.imageLimits)[1]
        except images.ImageError as e:
            raise ToolError(f"the data URL cannot be analysed: {e}") from None
        return picture.mime, data, "a data URL"
    scheme = urlparse(imageURL).scheme.lower()
    if scheme in ("http", "https"):
        return _fromWeb(ctx, imageURL)
    if scheme == "file":
        return _fromFile(ctx, unquote(urlparse(imageURL).path))
    if scheme and len(scheme) > 1:  # "c:" is a drive, not a scheme
        raise ToolError(f"image_url must be a file path, a file: URL, a data: URL or an http(s) URL, "
                        f"not a {scheme}: URL")
    return _fromFile(ctx, imageURL)


def visionAnalyze(ctx: ToolContext, image_url: str, question: str) -> ToolOutcome:
    vision = ctx.vision
    if vision is None:
        raise ToolError("no vision model is configured (HERMES_ACP_VISION_MODEL)")
    mime, data, source = _image(ctx, image_url)
    messages = [{"role": "user", "content": [{"type": "text", "text": question},
                                             images.imagePart(mime, data)]}]
    cancellation = ctx.cancellation or Cancellation()
    try:
        reply = ModelClient(vision.endpoint, limits=vision.limits).complete(
            vision.model, messages, [], cancellation, lambda text: None, lambda text: None)
    except ModelError as e:
        raise ToolError(f"the vision model {vision.model} could not analyse {source}: {e}") from None
    if reply.finishReason == CANCELLED_FINISH or cancellation.cancelled:
        raise ToolError("interrupted by the user before the vision model answered")
    analysis = reply.text.strip() or reply.refusal.strip()
    if not analysis:
        raise ToolError(f"the vision model {vision.model} answered nothing about {source}")
    extras = {"path": source} if source.startswith("/") else {}
    return ToolOutcome(jsonText({"success": True, "analysis": analysis}), extras)


VISION_ANALYZE = Tool(
    "vision_analyze",
    "Ask a vision model about an image (PNG, JPEG, GIF, WebP) and get its answer as text. Use it when "
    "you cannot see images yourself. image_url: a file path (relative paths start at the session's "
    "working directory), a file: URL, a data: URL or an http(s) URL.",
    parameters(
        ["image_url", "question"],
        image_url={"type": "string",
                   "description": "The image: a file path, a file: URL, a data: URL or an http(s) URL"},
        question={"type": "string", "description": "What to find out about the image"},
    ),
    visionAnalyze,
)
