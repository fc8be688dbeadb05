from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.compression import plan_compression
from policies.kept_lines import KeptLineMap, apply_kept_map, build_kept_map, content_hash
from policies.rendering import split_lines
from policies.segmentation import segment


def test_content_hash_is_sha256_of_utf8() -> None:
    assert content_hash("héllo") == hashlib.sha256("héllo".encode()).hexdigest()
    assert content_hash("a") != content_hash("a\n")


def sample() -> tuple[str, KeptLineMap, str]:
    text = "".join(f"line {i} with some words €\r\n" for i in range(300))
    lines = split_lines(text)
    lt = [7] * len(lines)
    units = segment(lines, lt, min_segment=20, max_segment=60)
    scores = [1.0 if k in (3, 17) else 0.0 for k in range(len(units))]
    plan = plan_compression(text, lt, scores, units, 200)
    assert plan.compressed
    m = build_kept_map(text, plan.kept_ranges, plan.total_tokens, plan.kept_tokens)
    return text, m, plan.text


def test_apply_reproduces_the_served_bytes() -> None:
    text, m, served = sample()
    assert apply_kept_map(text, m) == served
    assert m.rendered_hash == content_hash(served)
    assert m.content_hash == content_hash(text)


def test_apply_refuses_other_content_or_changed_rendering() -> None:
    text, m, _ = sample()
    with pytest.raises(ValueError, match="content hash"):
        apply_kept_map(text + "x", m)
    tampered = KeptLineMap(m.content_hash, m.kept_ranges, m.total_tokens + 1, m.kept_tokens, m.rendered_hash)
    with pytest.raises(ValueError, match="rendered hash"):
        apply_kept_map(text, tampered)


def _plain(value: object) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return isinstance(value, (str, int))


def test_dict_round_trip_uses_plain_types() -> None:
    _, m, _ = sample()
    d = m.to_dict()
    assert _plain(d)
    assert KeptLineMap.from_dict(d) == m
    # msgpack turns lists into lists and may hand back tuples; both are accepted.
    d2 = dict(d, kept_ranges=tuple(tuple(r) for r in d["kept_ranges"]))
    assert KeptLineMap.from_dict(d2) == m


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.pop("content_hash"),
        lambda d: d.update(total_tokens="12"),
        lambda d: d.update(kept_tokens=True),
        lambda d: d.update(kept_ranges=[[1, 2, 3]]),
        lambda d: d.update(kept_ranges=[["a", 2]]),
        lambda d: d.update(kept_ranges="0-5"),
        lambda d: d.update(rendered_hash=None),
    ],
)
def test_from_dict_rejects_malformed(mutate) -> None:  # type: ignore[no-untyped-def]
    _, m, _ = sample()
    d = m.to_dict()
    mutate(d)
    with pytest.raises(ValueError):
        KeptLineMap.from_dict(d)


@settings(max_examples=200)
@given(
    st.lists(st.text(alphabet=st.sampled_from("ab c\r\t€"), max_size=15), min_size=1, max_size=40),
    st.data(),
)
def test_apply_is_byte_identical_for_any_cut(raw: list[str], data: st.DataObject) -> None:
    text = "".join(r + "\n" for r in raw)
    n = len(split_lines(text))
    flags = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    ranges: list[tuple[int, int]] = []
    for i, keep in enumerate(flags):
        if keep:
            ranges = ranges[:-1] + [(ranges[-1][0], i)] if ranges and ranges[-1][1] == i - 1 else ranges + [(i, i)]
    total = data.draw(st.integers(0, 10**5))
    kept = data.draw(st.integers(0, total))
    m = build_kept_map(text, ranges, total, kept)
    first = apply_kept_map(text, m)
    again = apply_kept_map(text, KeptLineMap.from_dict(m.to_dict()))
    assert first == again
    assert content_hash(first) == m.rendered_hash
