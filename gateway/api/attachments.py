"""Non-text content (images, PDFs, audio, files) as short text placeholders.

The local model reads text only. Refusing an image would break the session for good (the block
stays in the client's history and is sent again every turn), so each non-text block becomes one
line such as `[image: 1 attachment omitted, png, 48 KB]`. The line depends only on the block's
own bytes, so the same history renders the same prompt every turn and the prefix cache holds.
"""

from __future__ import annotations

import re
from typing import Any

from policies.conversation_types import Attachment

# data:[<media type>][;base64],<data>
_DATA_URL = re.compile(r"^data:(?P<media>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^,;]*)*),(?P<data>.*)$", re.DOTALL)


def placeholder(kind: str, media_type: str | None = None, size: str | None = None) -> str:
    """`[image: 1 attachment omitted, png, 48 KB]`; format and size only when known."""
    details = [_short_format(media_type) if media_type else None, size]
    tail = "".join(f", {d}" for d in details if d)
    return f"[{kind}: 1 attachment omitted{tail}]"


def unknown_block(kind: str) -> str:
    """A block type this gateway does not know: named, never refused."""
    return f"[{kind}: 1 block omitted]"


def _short_format(media_type: str) -> str:
    # "image/png" -> "png", "application/pdf" -> "pdf", "audio/x-wav" -> "wav".
    subtype = media_type.rsplit("/", 1)[-1]
    return subtype.removeprefix("x-").split("+", 1)[0] or media_type


def base64_size(data: str) -> str:
    """The decoded size of base64 text, human-readable (from the length: nothing is decoded)."""
    stripped = data.strip()
    padding = len(stripped) - len(stripped.rstrip("="))
    return human_size(max(0, len(stripped) * 3 // 4 - padding))


def human_size(n_bytes: int) -> str:
    if n_bytes < 1024:
        return f"{n_bytes} B"
    if n_bytes < 1024 * 1024:
        return f"{round(n_bytes / 1024)} KB"
    return f"{n_bytes / (1024 * 1024):.1f} MB"


def url_placeholder(kind: str, url: object, media_type: str | None = None) -> str:
    """A placeholder for content given as a URL: a data: URL's size is known, a link's is not."""
    if isinstance(url, str):
        match = _DATA_URL.match(url)
        if match:
            media = match["media"] or media_type
            size = base64_size(match["data"]) if ";base64" in (match["params"] or "") else human_size(len(match["data"]))
            return placeholder(kind, media, size)
    return placeholder(kind, media_type, "url")


def _text_of(value: object) -> str | None:
    return value if isinstance(value, str) else None


def anthropic_block(block: dict[str, Any]) -> str:
    """An Anthropic `image` / `document` / other non-text block as its placeholder.

    A plain-text document (`source.type == "text"`) is text already: it is kept, under its title.
    """
    kind = str(block.get("type"))
    source = block.get("source")
    source = source if isinstance(source, dict) else {}
    media = _text_of(source.get("media_type"))
    source_type = source.get("type")
    if kind == "document" and source_type == "text" and isinstance(source.get("data"), str):
        title = _text_of(block.get("title"))
        return f"[document: {title}]\n{source['data']}" if title else source["data"]
    if kind not in ("image", "document"):
        return unknown_block(kind)
    if source_type == "base64" and isinstance(source.get("data"), str):
        return placeholder(kind, media or ("application/pdf" if kind == "document" else None),
                           base64_size(source["data"]))
    if source_type == "url":
        return url_placeholder(kind, source.get("url"), media)
    if source_type == "file":
        return placeholder(kind, media, "file")
    return placeholder(kind, media)


def openai_part(part: dict[str, Any]) -> str:
    """A Chat or Responses non-text content part as its placeholder.

    Chat: image_url {url}, input_audio {data, format}, file {file_data | file_id, filename}.
    Responses: input_image {image_url | file_id}, input_file {file_data | file_url | file_id}.
    """
    kind = str(part.get("type"))
    if kind == "image_url":
        inner = part.get("image_url")
        return url_placeholder("image", inner.get("url") if isinstance(inner, dict) else inner)
    if kind == "input_image":
        if part.get("image_url") is None and part.get("file_id") is not None:
            return placeholder("image", None, "file")
        return url_placeholder("image", part.get("image_url"))
    if kind == "input_audio":
        inner = part.get("input_audio")
        inner = inner if isinstance(inner, dict) else part
        fmt = _text_of(inner.get("format"))
        data = inner.get("data")
        return placeholder("audio", f"audio/{fmt}" if fmt else None, base64_size(data) if isinstance(data, str) else None)
    if kind in ("file", "input_file"):
        inner = part.get("file") if kind == "file" else part
        inner = inner if isinstance(inner, dict) else {}
        media = _media_from_name(inner.get("filename"))
        data = inner.get("file_data")
        if isinstance(data, str):  # a data: URL, or bare base64
            return url_placeholder("file", data, media) if data.startswith("data:") else placeholder(
                "file", media, base64_size(data))
        if isinstance(inner.get("file_url"), str):
            return url_placeholder("file", inner["file_url"], media)
        return placeholder("file", media, "file")
    return unknown_block(kind)


def _media_from_name(filename: object) -> str | None:
    if isinstance(filename, str) and "." in filename:
        return "file/" + filename.rsplit(".", 1)[-1].lower()
    return None


def anthropic_image(block: dict[str, Any], text: str) -> Attachment | None:
    """The image behind an Anthropic `image` block's placeholder `text`, as a URL an OpenAI-style
    multimodal upstream reads; None for anything else (documents, files by id)."""
    source = block.get("source")
    if block.get("type") != "image" or not isinstance(source, dict):
        return None
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        media = _text_of(source.get("media_type")) or "image/png"
        return Attachment(text, f"data:{media};base64,{source['data']}")
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return Attachment(text, source["url"])
    return None


def openai_image(part: dict[str, Any], text: str) -> Attachment | None:
    """The image behind a Chat `image_url` or Responses `input_image` part's placeholder `text`."""
    kind = part.get("type")
    if kind == "image_url":
        inner = part.get("image_url")
        url = inner.get("url") if isinstance(inner, dict) else inner
    elif kind == "input_image":
        url = part.get("image_url")
    else:
        return None
    return Attachment(text, url) if isinstance(url, str) and url else None
