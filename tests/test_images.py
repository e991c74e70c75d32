"""Image headers, limits and what a request carries (``engine.images``)."""

from __future__ import annotations

import base64

import pytest

from hermes_acp.engine import images
from hermes_acp.engine.compaction import SYNTHETIC_KEY, units
from hermes_acp.engine.images import ImageError, ImageLimits

from .imagedata import GIF, jpeg, png, webp


@pytest.mark.parametrize("data, expected", [
    (png(4, 3), ("image/png", 4, 3)),
    (jpeg(640, 480), ("image/jpeg", 640, 480)),
    (GIF, ("image/gif", 1, 1)),
    (webp(5, 7), ("image/webp", 5, 7)),
])
def test_headersGiveFormatAndSize(data, expected) -> None:
    picture = images.inspect(data)
    assert (picture.mime, picture.width, picture.height) == expected


def test_vp8AndVp8xWebP() -> None:
    lossy = b"RIFF" + (22).to_bytes(4, "little") + b"WEBPVP8 " + (10).to_bytes(4, "little") + b"\0\0\0\x9d\x01\x2a" + \
        (300).to_bytes(2, "little") + (200).to_bytes(2, "little")
    assert (images.inspect(lossy).width, images.inspect(lossy).height) == (300, 200)
    extended = b"RIFF" + (22).to_bytes(4, "little") + b"WEBPVP8X" + (10).to_bytes(4, "little") + b"\0" * 4 + \
        (1023).to_bytes(3, "little") + (767).to_bytes(3, "little")
    assert (images.inspect(extended).width, images.inspect(extended).height) == (1024, 768)


@pytest.mark.parametrize("data, message", [
    (b"hello world, plain text", "not an image"),
    (b"BM" + b"\0" * 60, "BMP image; the model can be shown PNG, JPEG, GIF and WebP images only"),
    (b"\0\0\0\x18ftypheic" + b"\0" * 40, "HEIC image"),
    (png()[:20], "PNG header is damaged or cut short"),
    (png()[:-12], "PNG image is cut short"),
    (jpeg()[:-2], "JPEG image is cut short"),
    (b"\xff\xd8\xff\xda\x00\x08" + b"\0" * 40 + b"\xff\xd9", "JPEG header is damaged"),
    (GIF[:-1], "GIF image is cut short"),
    (webp()[:-4], "WebP image is cut short"),
    (b"RIFF\x10\0\0\0WEBPVP8Z" + b"\0" * 20, "WebP header is damaged"),
])
def test_badImagesSayWhy(data, message) -> None:
    with pytest.raises(ImageError, match=message.replace("(", r"\(")):
        images.inspect(data)


def test_limitsNameTheirSetting() -> None:
    limits = ImageLimits(maxBytes=2048, maxSide=100)
    with pytest.raises(ImageError, match=r"it is 3\.0 KiB, and images up to 2\.0 KiB .*HERMES_ACP_IMAGE_MAX_BYTES.*smaller copy"):
        images.checked(b"\0" * 3072, limits)
    with pytest.raises(ImageError, match=r"it is 101×5 pixels, .*up to 100 pixels on their longest side .*HERMES_ACP_IMAGE_MAX_SIDE"):
        images.checked(png(101, 5), limits)
    assert images.checked(png(100, 100), limits).width == 100


def _imageMessage(count: int) -> dict:
    encoded = base64.b64encode(png()).decode()
    found = [("read_file", images.attachment(f"/p/{i}.png", "image/png", encoded, images.inspect(png()), 70,
                                             ImageLimits())) for i in range(count)]
    message = images.imagesMessage(found, ImageLimits(), SYNTHETIC_KEY)
    assert message is not None
    return message


def test_imagesMessageChecksEachImage() -> None:
    encoded = base64.b64encode(png()).decode()
    found = [("read_file", {"label": "/p/a.png", "mimeType": "image/png", "data": encoded}),
             ("mcp__s__shot", {"label": "shot", "mimeType": "image/png", "data": "not base64!"}),
             ("mcp__s__shot", {"label": "lie", "mimeType": "image/gif", "data": encoded})]
    message = images.imagesMessage(found, ImageLimits(), SYNTHETIC_KEY)
    texts = [p["text"] for p in message["content"] if p["type"] == "text"]
    assert message["role"] == "user" and message[SYNTHETIC_KEY] == images.IMAGES
    assert "Image 1, from read_file: /p/a.png (PNG, 4×3 pixels" in texts[1]
    assert texts[2] == "Image 2, from mcp__s__shot: shot — not shown: its data is not base64"
    assert "says it is 'image/gif' but holds a PNG image" in texts[3]
    assert [p["image_url"]["url"] for p in message["content"] if p["type"] == "image_url"] == [
        f"data:image/png;base64,{encoded}"]


def test_requestCarriesTheNewestImagesOnlyToAModelThatSees() -> None:
    history = [{"role": "user", "content": "look"}, _imageMessage(3), _imageMessage(2)]
    seen = images.forModel(history, True, 3, "blind")
    kinds = [[p["type"] for p in m["content"]] for m in seen[1:]]
    assert [k.count("image_url") for k in kinds] == [1, 2]
    assert seen[0] is history[0] and history[1]["content"][2]["type"] == "image_url"  # the history is not changed
    blind = images.forModel(history, False, 3, "blind")
    assert all(p["type"] == "text" for m in blind[1:] for p in m["content"])
    assert sum(p["text"] == "blind" for m in blind[1:] for p in m["content"]) == 5


def test_imagesStayWithTheirToolCallsInCompaction() -> None:
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "a", "type": "function",
                                                                   "function": {"name": "read_file", "arguments": "{}"}}]}
    history = [{"role": "user", "content": "look"}, call, {"role": "tool", "tool_call_id": "a", "content": "x"},
               _imageMessage(1), {"role": "assistant", "content": "a red square"}]
    assert [len(u) for u in units(history)] == [1, 3, 1]


def test_promptImagesAreCheckedAndRelabelled() -> None:
    encoded = base64.b64encode(png()).decode()
    content = [{"type": "text", "text": "what is it?"},
               {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{encoded}"}},
               {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"BM" + b"\0" * 9).decode()}}]
    checked = images.checkedPrompt(content, ImageLimits())
    assert checked[1] == images.imagePart("image/png", encoded)
    assert checked[2]["text"].startswith("[An attached image is not shown: it is a BMP image")
    assert images.checkedPrompt("text only", ImageLimits()) == "text only"


def test_compactionsCheapPassDropsOlderImages() -> None:
    from hermes_acp.engine.compaction import shorten

    prompt = {"role": "user", "content": [{"type": "text", "text": "see"}, images.imagePart("image/png", "AAAA")]}
    older = [[prompt], [_imageMessage(1)]]
    result, changed = shorten(older, [prompt])
    assert changed == 2
    assert not any(p["type"] == "image_url" for unit in result for m in unit for p in m["content"])
    assert result[0][0]["content"][1]["text"].startswith("[An image was here; removed to save context")
    assert prompt["content"][1]["type"] == "image_url"  # copied, never edited in place


@pytest.mark.parametrize("status, detail, images_", [
    (400, "Invalid content type. image_url is only supported by certain models.", True),
    (400, "Qwen2ForCausalLM is not a multimodal model", True),
    (500, "image input is not supported - hint: you may need to provide the mmproj", True),  # llama.cpp
    (500, "CUDA out of memory while processing the image", False),  # another 500 is retried
    (404, "No endpoints found that support image input", True),
    (400, "This model's maximum context length is 8192 tokens (the image counts)", False),  # an overflow
    (400, "temperature must be at most 2", False),
])
def test_anEndpointRefusingImagesIsRecognised(status, detail, images_) -> None:
    from hermes_acp.config import Endpoint
    from hermes_acp.engine.chat_http import HTTPStatus
    from hermes_acp.engine.model import classify

    error = classify(HTTPStatus(status, {"error": {"message": detail}}, {}), Endpoint("custom", "http://h/v1"), "m")
    assert error.images is images_
    if images_:
        assert str(error).startswith("Model 'm' at http://h/v1 does not take images")


@pytest.mark.parametrize("entry, sees", [
    ({"id": "a", "architecture": {"input_modalities": ["text", "image"]}}, True),
    ({"id": "a", "architecture": {"input_modalities": ["text"]}}, False),
    ({"id": "a", "architecture": {"modality": "text+image->text"}}, True),
    ({"id": "a", "architecture": {"modality": "text->text"}}, False),
    ({"id": "a", "supports_vision": True}, True),
    ({"id": "a", "capabilities": {"vision": False}}, False),
    ({"id": "a", "capabilities": ["completion", "vision"]}, True),
    ({"id": "a"}, None),
    ({"id": "a", "architecture": "odd"}, None),
])
def test_modelListsSayWhoSees(entry, sees) -> None:
    from hermes_acp.engine.model import modelVision

    assert modelVision(entry) is sees


def test_theVisionSetting() -> None:
    from hermes_acp.config import ConfigError, Settings
    from hermes_acp.sight import Sight

    assert Sight.parse("").sees("m", None) is None and Sight.parse("AUTO").sees("m", True) is True
    assert Sight.parse("on").sees("m", False) is True and Sight.parse("off").sees("m", True) is False
    models = Sight.parse("gpt-4o*, claude-*")
    assert (models.sees("gpt-4o-mini", None), models.sees("qwen", True)) == (True, False)
    assert not Sight.parse("off").maybe and Sight.parse("x").maybe
    with pytest.raises(ConfigError, match="HERMES_ACP_MODEL_VISION must be auto, on, off or model names"):
        Settings.fromEnv({"HERMES_ACP_MODEL_VISION": "gpt-4o,off"})
    settings = Settings.fromEnv({"HERMES_ACP_VISION_MODEL": "eye", "HERMES_ACP_VISION_API_KEY": "sk-vision-secret",
                                 "HERMES_ACP_IMAGE_MAX_BYTES": "4096"})
    assert "sk-vision-secret" not in repr(settings) and settings.imageMaxBytes == 4096


def test_theVisionModelsEndpoint() -> None:
    from hermes_acp.config import Endpoint, Settings

    main = Endpoint("custom", "http://main/v1", "main-key", "big")
    same = images.visionModel(Settings(visionModel="eye"), main)
    assert (same.endpoint.baseURL, same.endpoint.apiKey, same.model) == ("http://main/v1", "main-key", "eye")
    other = images.visionModel(Settings(visionModel="eye", visionBaseURL="http://eye/v1", visionApiKey="k2"), main)
    assert (other.endpoint.baseURL, other.endpoint.apiKey) == ("http://eye/v1", "k2")
    assert images.visionModel(Settings(), main) is None


def test_visionAnalyzeArguments(bench, tmp_path) -> None:
    """Without a vision model the tool says so; http(s) URLs are not fetched; a bad data URL,
    a missing file and a damaged image say why, before any request is made."""
    from hermes_acp.config import Endpoint
    from hermes_acp.engine.tools.registry import runTool
    from hermes_acp.engine.tools.vision import VISION_ANALYZE

    (tmp_path / "cut.png").write_bytes(png()[:-12])
    context = bench.agent.toolContext(bench.cancelEvent, bench.observer, bench.workspace, "v.1")
    assert "no vision model is configured" in runTool(VISION_ANALYZE, context, {"image_url": "a.png", "question": "?"}).text
    bench.agent.visionModel = images.VisionModel(Endpoint("custom", "http://127.0.0.1:9/v1"), "eye")
    context = bench.agent.toolContext(bench.cancelEvent, bench.observer, bench.workspace, "v.2")
    for url, words in [("http://127.0.0.1:9/a.png", "cannot be analysed: 127.0.0.1 resolves to 127.0.0.1, a loopback"),
                       ("data:image/png;base64,!!!", "the data URL cannot be analysed: its data is not base64"),
                       ("missing.png", "file not found"),
                       ("cut.png", "cannot be analysed: the PNG image is cut short"),
                       ("ftp://host/a.png", "not a ftp: URL")]:
        outcome = runTool(VISION_ANALYZE, context, {"image_url": url, "question": "what?"})
        assert outcome.failed and words in outcome.text, (url, outcome.text)
    assert "vision_analyze" in bench.agent.activeTools()


def test_oneStepKeepsAtMostPerRequestImages() -> None:
    encoded = base64.b64encode(png()).decode()
    found = [("mcp__s__shots", {"label": f"shot {i}", "mimeType": "image/png", "data": encoded}) for i in range(5)]
    message = images.imagesMessage(found, ImageLimits(perRequest=2), SYNTHETIC_KEY)
    assert sum(p["type"] == "image_url" for p in message["content"]) == 2
    assert message["content"][-1]["text"] == ("Image 5, from mcp__s__shots: shot 4 — not shown: only the first 2 images of "
                                              "one reply's tool results are (HERMES_ACP_IMAGES_PER_REQUEST)")


def test_imagesBeforeAUserMessageJoinIt() -> None:
    """A turn that ended after its tools ran leaves the images message last: the next prompt
    is joined to it in the request (never two user messages in a row)."""
    history = [{"role": "tool", "tool_call_id": "a", "content": "x"}, _imageMessage(1),
               {"role": "user", "content": "and now?"}]
    request = images.joined(history, SYNTHETIC_KEY)
    assert [m["role"] for m in request] == ["tool", "user"]
    assert request[1]["content"][-1] == {"type": "text", "text": "and now?"}
    assert sum(p["type"] == "image_url" for p in request[1]["content"]) == 1
    assert images.joined(history[:2], SYNTHETIC_KEY) == history[:2]


def test_anOversizedBase64ImageIsRefusedBeforeItIsDecoded(monkeypatch) -> None:
    def decodeNothing(*args, **kwargs):
        raise AssertionError("decoded")

    monkeypatch.setattr(images.base64, "b64decode", decodeNothing)
    with pytest.raises(ImageError, match=r"it is 3\.0 KiB, and images up to 2\.0 KiB"):
        images.fromBase64("A" * 4096, ImageLimits(maxBytes=2048))


def test_theCatalogsWordOnSight() -> None:
    """``auto``: a refusal beats the model list; an explicit setting beats both."""
    from hermes_acp.catalog import ModelCatalog
    from hermes_acp.sight import Sight

    auto = ModelCatalog(lambda: None, None, None, seeing={"a": True, "b": False})
    assert (auto.sees("a"), auto.sees("b"), auto.sees("c")) == (True, False, None)
    auto.learnBlind("a")
    assert auto.sees("a") is False
    insisted = ModelCatalog(lambda: None, None, None, sight=Sight.parse("a*"), seeing={"b1": True})
    insisted.learnBlind("a1")
    assert (insisted.sees("a1"), insisted.sees("b1")) == (True, False)
