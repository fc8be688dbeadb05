"""The status page's strip reads back what the renderers wrote: kept lines where the compressed
message shows them, recalled lines where the excerpt shows them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from policies.recall import render_excerpts
from policies.rendering import omitted_ranges, render_compressed
from policies.strip import Band, excerpts, note_total_lines, strip_bands
from sessions.record import TURN_LOG_LIMIT, SessionRecord
from tests.test_policies_rendering import rendering_cases


Case = tuple[list[str], tuple[tuple[int, int], ...], int, int]


def assert_bands_show_their_lines(bands: list[Band], lines: list[str], texts: dict[int, list[str]]) -> None:
    """Every band that points into a served text finds exactly its original lines there."""
    for band in bands:
        if band.served_in is None:
            continue
        assert band.served_line is not None
        shown = texts[band.served_in][band.served_line : band.served_line + band.last - band.first + 1]
        # Compared without line endings (CRs included): an excerpt that ends on the text's
        # unterminated last line gives it one, in the excerpt's own line ending.
        assert [x.rstrip("\r") for x in shown] == [
            line.removesuffix("\n").rstrip("\r") for line in lines[band.first : band.last + 1]]


@given(rendering_cases())
def test_kept_bands_point_at_their_lines_in_the_served_message(case: Case) -> None:
    lines, kept, total, kept_tokens = case
    served = render_compressed(lines, kept, total, kept_tokens).split("\n")
    assert note_total_lines(served[0]) == len(lines)
    bands = strip_bands(kept, [], len(lines), served_in=3)
    assert [(b.first, b.last) for b in bands if b.kept] == list(kept)
    assert [(b.first, b.last) for b in bands if not b.kept] == list(omitted_ranges(kept, len(lines)))
    assert bands[0].first == 0 and bands[-1].last == len(lines) - 1
    assert all(a.last + 1 == b.first for a, b in zip(bands, bands[1:]))
    assert all((b.served_in == 3) == b.kept and not b.recalled for b in bands)
    assert_bands_show_their_lines(bands, lines, {3: served})


@given(rendering_cases(), st.data())
def test_recalled_excerpts_are_found_and_marked(case: Case, data: st.DataObject) -> None:
    lines, kept, _total, _kept_tokens = case
    gaps = list(omitted_ranges(kept, len(lines)))
    chosen = sorted(data.draw(st.lists(st.sampled_from(gaps), unique=True))) if gaps else []
    label = "the output of read_file(call_1)"
    turn = render_excerpts(lines, chosen, label) + "\nWhat about it?"
    found = excerpts(turn)
    assert [(e.first, e.last, e.label) for e in found] == [(a, b, label) for a, b in chosen]
    recalled = [((e.first, e.last), 7, e.header_line + 1) for e in found]
    bands = strip_bands(kept, recalled, len(lines), served_in=None)  # the compressed message not at hand
    assert [(b.first, b.last) for b in bands if b.recalled] == chosen
    assert all((b.served_in == 7) == b.recalled for b in bands)
    assert_bands_show_their_lines(bands, lines, {7: turn.split("\n")})


def test_note_and_excerpt_parsers_ignore_other_text() -> None:
    assert note_total_lines("[pflash: showing 1,200 of 34,567 lines (…)]") == 34567
    assert note_total_lines("plain text") is None
    assert excerpts("no excerpts\n[pflash: recalled nothing]") == []


def test_turn_log_is_bounded_and_round_trips() -> None:
    record = SessionRecord("s", "t", client_key="my-session")
    for i in range(TURN_LOG_LIMIT + 5):
        record.log_turn({"prompt_tokens": i, "compression": {"compressed": True, "message": "h", "lines": 3}})
    assert len(record.turn_log) == TURN_LOG_LIMIT and record.turn_log[0]["prompt_tokens"] == 5
    again = SessionRecord.from_dict(record.to_dict())
    assert again.turn_log == record.turn_log and again.client_key == "my-session"
    old = record.to_dict()
    del old["turn_log"], old["client_key"]  # a record written before the status page
    assert SessionRecord.from_dict(old).turn_log == []
