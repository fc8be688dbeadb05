"""Images, documents, audio and files in every API become deterministic text placeholders, and
tool errors are visible in the tool message: pure adapter tests (no model)."""

from __future__ import annotations

import base64

from gateway.api import chat as chat_api
from gateway.api import messages as messages_api
from gateway.api import responses as responses_api
from gateway.api.attachments import base64_size, placeholder, url_placeholder

PNG_48K = base64.b64encode(b"\x89PNG" + b"\0" * (48 * 1024 - 4)).decode()
PDF_B64 = base64.b64encode(b"%PDF-1.4" + b"\0" * 3000).decode()


def test_placeholder_sizes_come_from_the_base64_length() -> None:
    assert base64_size(PNG_48K) == "48 KB"
    assert base64_size(base64.b64encode(b"abcd").decode()) == "4 B"  # "YWJjZA==": padding discounted
    assert base64_size(base64.b64encode(b"\0" * (3 * 1024 * 1024)).decode()) == "3.0 MB"
    assert placeholder("image", "image/png", "48 KB") == "[image: 1 attachment omitted, png, 48 KB]"
    assert url_placeholder("image", "https://example.com/a.png") == "[image: 1 attachment omitted, url]"
    assert url_placeholder("image", f"data:image/jpeg;base64,{PNG_48K}") == "[image: 1 attachment omitted, jpeg, 48 KB]"


def test_anthropic_images_and_documents_everywhere_become_placeholders() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_48K}}
    body = {
        "model": "m",
        "max_tokens": 50,
        "messages": [
            {"role": "user", "content": [image, {"type": "text", "text": "what is this?", "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "/a.png"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [image], "is_error": False},
                {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF_B64}},
                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain words"},
                 "title": "notes.txt"},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/x.png"}},
                {"type": "search_result", "source": "s", "title": "t", "content": []},
            ]},
        ],
    }
    conv = messages_api.parse_request(body, {})
    assert [m.content for m in conv.messages] == [
        "[image: 1 attachment omitted, png, 48 KB]\n\nwhat is this?",
        "",
        "[image: 1 attachment omitted, png, 48 KB]",
        "[document: 1 attachment omitted, pdf, 3 KB]\n\n[document: notes.txt]\nplain words\n\n"
        "[image: 1 attachment omitted, url]\n\n[search_result: 1 block omitted]",
    ]
    assert messages_api.parse_request(body, {}) == conv  # deterministic: the prefix cache holds


def test_anthropic_tool_error_is_visible_in_the_tool_message() -> None:
    body = {
        "model": "m",
        "max_tokens": 50,
        "messages": [
            {"role": "user", "content": "run it"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                                          "content": [{"type": "text", "text": "ls: no such file"}]}]},
        ],
    }
    tool = messages_api.parse_request(body, {}).messages[-1]
    assert tool.role == "tool" and tool.is_error and tool.content == "[tool error]\nls: no such file"


def test_chat_image_audio_and_file_parts_become_placeholders() -> None:
    body = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_48K}", "detail": "high"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"\0" * 2048).decode(), "format": "wav"}},
        {"type": "file", "file": {"file_data": f"data:application/pdf;base64,{PDF_B64}", "filename": "spec.pdf"}},
        {"type": "file", "file": {"file_id": "file-abc"}},
    ]}]}
    assert chat_api.parse_request(body, {}).messages[0].content == "\n\n".join([
        "look",
        "[image: 1 attachment omitted, png, 48 KB]",
        "[image: 1 attachment omitted, url]",
        "[audio: 1 attachment omitted, wav, 2 KB]",
        "[file: 1 attachment omitted, pdf, 3 KB]",
        "[file: 1 attachment omitted, file]",
    ])


def test_responses_input_image_and_input_file_become_placeholders() -> None:
    body = {"input": [
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "see"},
            {"type": "input_image", "image_url": f"data:image/png;base64,{PNG_48K}", "detail": "auto"},
            {"type": "input_file", "file_data": f"data:application/pdf;base64,{PDF_B64}", "filename": "a.pdf"},
            {"type": "input_file", "file_url": "https://example.com/a.pdf"},
        ]},
        {"type": "function_call", "call_id": "c1", "name": "view_image", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [
            {"type": "input_image", "image_url": "https://example.com/shot.png"}]},
    ]}
    conv = responses_api.parse_request(body, {})
    assert conv.messages[0].content == (
        "see\n\n[image: 1 attachment omitted, png, 48 KB]\n\n[file: 1 attachment omitted, pdf, 3 KB]\n\n"
        "[file: 1 attachment omitted, url]"
    )
    assert conv.messages[-1].content == "[image: 1 attachment omitted, url]"
