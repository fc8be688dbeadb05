"""The learned ranker (--scorer ranker, the default): features, weights, fitting, and its fallback."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings as hsettings, strategies as st

from engine.scoring.ranker import (
    ANSWERS_CALL,
    FEATURES,
    MEANING_UNIT_TOKENS,
    SET_FEATURES,
    SHIPPED_RANKER,
    TRANSCRIPT_FEATURES,
    UNASKED,
    RankerError,
    RankerScorer,
    RankerWeights,
    WeightSet,
    cited_spans,
    fit_weights,
    load_weights,
    ranker_features,
)
from engine.scoring.bundle import ScorerBundle, bundle_of
from engine.scoring.scorers import Bm25Scorer
from engine.scoring.embedder import DEFAULT_UNIT_TOKENS

FILLER = [
    "def render_header(page):\n    return page.title.upper()\n",
    "def parse_config(path):\n    with open(path) as fh:\n        return fh.read()\n",
    "class Cache:\n    def __init__(self):\n        self.items = {}\n",
    "def log_event(name, payload):\n    print(name, payload)\n",
]


def numbered(first: int, body: list[str]) -> str:
    return "".join(f"{first + k:6d}\t{line}\n" for k, line in enumerate(body))


def test_features_have_one_row_per_unit_and_are_scale_free() -> None:
    units = [*FILLER, "def compute_invoice_total(items, tax_rate):\n    return sum(items) * (1 + tax_rate)\n"]
    x = ranker_features(units, "Where is the invoice total computed with the tax rate?")
    assert x.shape == (len(units), len(FEATURES))
    assert np.isfinite(x).all()
    best = FEATURES.index("bm25_of_best")
    assert x[-1, best] == 1.0 and (x[:-1, best] < 1.0).all()  # the invoice unit is the best match
    # Doubling every unit's text doubles raw BM25 terms but not the rank or share columns.
    y = ranker_features([u + u for u in units], "Where is the invoice total computed with the tax rate?")
    for name in ("bm25_rank", "line_bm25_rank", "rare_terms"):
        k = FEATURES.index(name)
        assert np.allclose(x[:, k], y[:, k]), name


def test_cited_line_numbers_mark_the_units_that_show_them() -> None:
    assert cited_spans("nl -ba django/forms.py | sed -n '130,170p'") == [(130, 170)]
    assert cited_spans("File \"x.py\", line 142, in f") == [(142, 142)]
    assert cited_spans("lines 10-100000") == [(10, 10)]  # not a range anyone reads
    shown = numbered(128, ["a = 1", "b = 2", "c = 3", "d = 4"])  # 128..131: two of four cited
    elsewhere = numbered(900, ["a = 1", "b = 2", "c = 3", "d = 4"])
    grep_hit = "forms.py:140:    value = clean(value)\n"
    x = ranker_features([shown, elsewhere, grep_hit], "sed -n '130,170p' forms.py")
    cited = x[:, FEATURES.index("cited_line_share")]
    assert cited.tolist() == [0.5, 0.0, 1.0]


def test_line_numbers_the_message_cites_elsewhere_mark_the_view_that_shows_them() -> None:
    """A session log: the agent opened 1327-1332, later printed 1329-1330 again and a traceback named
    line 1331. The view's own command does not count for it, numbered lines never cite, and a
    view nothing else points at gets nothing."""
    view = "$ nl -ba query.py | sed -n '1327,1332p'\n" + numbered(1327, [f"x{k} = {k}" for k in range(6)])
    other_view = numbered(40, ["a = 1331", "b = 2"])  # its literal 1331 is code, not a citation
    later = "$ sed -n '1329,1330p' query.py\n    x2 = 2\n    x3 = 3\n"
    trace = 'File "query.py", line 1331, in _add_q\n'
    x = ranker_features([view, other_view, later, trace], "filter")
    elsewhere = x[:, FEATURES.index("cited_elsewhere")]
    assert elsewhere.tolist() == [3 / 6, 0.0, 0.0, 0.0]
    assert x[:, FEATURES.index("neighbour_cited_elsewhere")].tolist() == [0.0, 0.5, 0.0, 0.0]
    alone = ranker_features([view, other_view], "filter")[:, FEATURES.index("cited_elsewhere")]
    assert alone.tolist() == [0.0, 0.0]  # only its own command cites it


def _cited_elsewhere_by_hand(units: list[str]) -> list[float]:
    from policies.line_numbers import line_number

    citing = [[span for line in u.splitlines() if line_number(line) is None for span in cited_spans(line)]
              for u in units]
    out = []
    for k, u in enumerate(units):
        numbers = [found[0] for line in u.splitlines() if (found := line_number(line)) is not None]
        spans = [s for j, c in enumerate(citing) if j != k for s in c]
        out.append(sum(any(a <= v <= b for a, b in spans) for v in numbers) / len(numbers) if numbers else 0.0)
    return out


_LOG_LINES = st.one_of(
    st.builds(lambda n, t: f"{n:6d}\t{t}", st.integers(10, 60), st.sampled_from(["x = 1", "return y", "pass"])),
    st.builds(lambda a, b: f"$ sed -n '{a},{a + b}p' f.py", st.integers(10, 60), st.integers(0, 9)),
    st.builds(lambda a: f'File "f.py", line {a}, in g', st.integers(10, 60)),
    st.sampled_from(["plain words", "12 passed, 3 failed", ""]),
)


@hsettings(max_examples=80, deadline=None)
@given(st.lists(st.lists(_LOG_LINES, min_size=1, max_size=6), max_size=8))
def test_cited_elsewhere_counts_each_numbered_line_cited_by_another_unit(units_lines: list[list[str]]) -> None:
    units = ["".join(line + "\n" for line in lines) for lines in units_lines]
    got = ranker_features(units, "x").T[FEATURES.index("cited_elsewhere")] if units else np.zeros(0)
    assert np.allclose(got, _cited_elsewhere_by_hand(units))


def test_a_log_stretch_about_the_task_lifts_its_quiet_units() -> None:
    """`around_bm25`: the mean relevance over a unit and three on either side, as a share of the best."""
    on_task = ["def compute_invoice_total(items):\n", "invoice total tax\n", "    return total\n"]
    units = [*FILLER * 3, *on_task, *FILLER * 3]
    around = ranker_features(units, "invoice total").T[FEATURES.index("around_bm25")]
    quiet_inside, quiet_far = len(FILLER) * 3 + 2, 0
    assert around.max() == 1.0 and around[quiet_inside] > around[quiet_far]


@hsettings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=80), max_size=12),
       st.text(max_size=60))
def test_features_are_finite_and_deterministic_for_any_text(units: list[str], request: str) -> None:
    x = ranker_features(units, request)
    assert x.shape == (len(units), len(FEATURES))
    assert np.isfinite(x).all()
    assert np.array_equal(x, ranker_features(units, request))
    for name in ("bm25_rank", "bm25_of_best", "line_bm25_of_best", "rare_terms", "cited_line_share", "repeated_lines",
                 "around_bm25", "around_line_bm25", "cited_elsewhere", "neighbour_cited_elsewhere", "edited_later"):
        col = x[:, FEATURES.index(name)]
        assert ((col >= 0) & (col <= 1)).all(), name


def test_lines_shown_again_elsewhere_mark_their_units() -> None:
    """The same code opened twice (once numbered by `cat -n`, once bare) counts; short lines do not."""
    body = ["def compute_invoice_total(items):", "    return sum(items)", ")"]
    opened = numbered(40, body)
    again = "$ sed -n '40,41p' billing.py\n" + "".join(line + "\n" for line in body[:2])
    units = [opened, FILLER[0], again, ")\n)\n"]
    share = ranker_features(units, "invoice").T[FEATURES.index("repeated_lines")]
    assert share.tolist() == [1.0, 0.0, 2 / 3, 0.0]  # `)` is too short; `$ sed ...` is not shown twice
    assert ranker_features([opened + opened], "invoice")[0, FEATURES.index("repeated_lines")] == 0.0  # only elsewhere


def test_the_shipped_weights_load_and_rank_the_needed_unit_first() -> None:
    model = load_weights(SHIPPED_RANKER)
    assert set(model.sets) == set(SET_FEATURES) and model.info["splits"] == ["train", "validation"]
    for name in TRANSCRIPT_FEATURES:  # what only a transcript shows ranks transcripts alone
        assert name not in model.sets[ANSWERS_CALL].features and name in model.sets[UNASKED].features
    units = [*FILLER * 5, "def compute_invoice_total(items, tax_rate):\n    return sum(items) * (1 + tax_rate)\n"]
    for scorer in (RankerScorer(), bundle_of(RankerScorer()).unasked):
        scores = scorer.score(units, "Why is compute_invoice_total wrong when tax_rate is 0?")
        assert len(scores) == len(units) and all(0.0 < s < 1.0 for s in scores)
        assert int(np.argmax(scores)) == len(units) - 1


def test_unasked_text_is_scored_with_its_own_weights() -> None:
    """A repeated unit gains only under the unasked set: the two sets really differ where they should."""
    scorer = RankerScorer()
    unasked = bundle_of(scorer).unasked
    assert unasked is not scorer and unasked.weights is scorer.model.sets[UNASKED]
    assert scorer.weights is scorer.model.sets[ANSWERS_CALL]
    seen = "def apply_discount(order):\n    return order.total * order.rate\n"
    units = [seen, *FILLER, "def apply_discount_v2(order):\n    return order.total\n", seen]
    request = "apply_discount order total"
    base = ranker_features(units, request)
    flat = base.copy()
    flat[:, FEATURES.index("repeated_lines")] = 0.0
    assert np.allclose(scorer.weights.probabilities(base), scorer.weights.probabilities(flat))
    assert (unasked.weights.probabilities(base)[[0, -1]] > unasked.weights.probabilities(flat)[[0, -1]]).all()


def test_fitting_finds_the_informative_feature() -> None:
    rng = np.random.default_rng(0)
    examples = []
    for _ in range(20):
        x = rng.random((50, 3))
        y = (x[:, 1] + 0.1 * rng.standard_normal(50) > 0.8).astype(float)
        examples.append((x, y))
    weights, bias = fit_weights(examples)
    assert weights[1] > 5 * max(abs(weights[0]), abs(weights[2]))
    assert bias < 0


def write(path: Path, **doc: object) -> Path:
    base = json.loads(SHIPPED_RANKER.read_text())
    base.update(doc)
    path.write_text(json.dumps(base))
    return path


def one_set(**change: object) -> dict[str, object]:
    sets = json.loads(SHIPPED_RANKER.read_text())["sets"]
    sets[UNASKED].update(change)
    return sets


@pytest.mark.parametrize("change", [
    {"schema": "something.else"},
    {"version": 1},
    {"version": 2},  # a file from before the meaning sets
    {"features": ["bm25_rank"]},
    {"sets": {}},
    {"sets": one_set(features=["no_such_feature"])},
    {"sets": one_set(weights=[float("nan")] * len(FEATURES))},
    {"sets": one_set(weights=[1.0])},
    {"sets": one_set(bias="high")},
    {"size_exponent": -0.5},
    {"size_exponent": float("nan")},
    {"size_exponent": "0.5"},
])
def test_malformed_weights_are_refused(tmp_path: Path, change: dict[str, object]) -> None:
    with pytest.raises(RankerError):
        load_weights(write(tmp_path / "r.json", **change))


def test_weights_round_trip(tmp_path: Path) -> None:
    sets = {kind: WeightSet(names, np.arange(len(names), dtype=float), -2.5) for kind, names in SET_FEATURES.items()}
    path = tmp_path / "r.json"
    path.write_text(RankerWeights(sets, {"note": "test"}, 0.6).to_json())
    back = load_weights(path)
    assert back.info == {"note": "test"} and back.size_exponent == 0.6 and RankerScorer(path).size_exponent == 0.6
    for kind, ws in sets.items():
        got = back.sets[kind]
        assert got.features == ws.features and np.array_equal(got.weights, ws.weights) and got.bias == -2.5


def test_a_missing_ranker_falls_back_to_bm25_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from gateway.config import load_settings
    from gateway.scorer_factory import build_scorer

    default = build_scorer(load_settings({"store_dir": tmp_path}))
    assert isinstance(default.scorers.compress, RankerScorer) and default.fallback is None
    # The encoder reads units as the trainer's did; the embed scorer keeps the encoder's own default.
    assert default.scorers.compress.dense is not None
    assert default.scorers.compress.dense.max_unit_tokens == MEANING_UNIT_TOKENS != DEFAULT_UNIT_TOKENS
    with caplog.at_level(logging.WARNING, logger="pflash.scorer"):
        choice = build_scorer(load_settings({"store_dir": tmp_path, "ranker": str(tmp_path / "missing.json")}))
    assert isinstance(choice.scorers.compress, Bm25Scorer)
    assert choice.fallback is not None and "ranker" in choice.fallback
    assert any("bm25" in r.getMessage() for r in caplog.records)


SWE_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.mark.skipif(not (SWE_DATA / "swe-dev.jsonl.zst").is_file(), reason="../shared/data is not here")
def test_train_ranker_fits_on_train_and_validation_only(tmp_path: Path, model_path: Path) -> None:
    """`python -m benchmarks.train ranker` from a small data set: a file that loads, and no test-split session read."""
    import subprocess
    import sys

    import zstandard

    from benchmarks.training.agent_data import load_jsonl_zst
    from benchmarks.training.splits import split_of

    records = load_jsonl_zst(SWE_DATA / "swe-dev.jsonl.zst")
    astropy = [r for r in records if r["id"].startswith("astropy__")]
    picked = [r for r in astropy if split_of("swe", r["id"]) in ("train", "validation")][:3]
    test_ids = [r["id"] for r in astropy if split_of("swe", r["id"]) == "test"]
    assert {split_of("swe", r["id"]) for r in picked} == {"train", "validation"} and test_ids
    data = tmp_path / "data"
    data.mkdir()
    lines = "".join(json.dumps(r) + "\n" for r in picked + [r for r in astropy if r["id"] in test_ids])
    (data / "swe-dev.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))
    out = tmp_path / "ranker.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.train", "ranker", "--out", str(out), "--data", str(data),
         "--drafter", str(model_path), "--store-dir", str(tmp_path / "store")],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    model = load_weights(out)
    assert model.info["sessions"] == len(picked)  # the test-split sessions in the file were not read
    assert model.info["outputs"] >= len(picked)  # a session log each, and a tool output where one holds gold
    assert "validation keeps" in result.stderr and "cross-validation by session" in result.stderr
    assert set(model.info["cross_validated_gold_kept_27"]) == {
        "ranker", "ranker_at_15", "ranker_lexical", "bm25", "bm25_at_15",
        *(f"ranker_{kind}{at}" for kind in (ANSWERS_CALL, UNASKED) for at in ("", "_at_15"))}
    trials = model.info["cross_validated_by_size_exponent"]
    assert model.size_exponent == max(float(b) for b, kept in trials.items() if kept == max(trials.values()))
    assert all(model.info["examples_by_set"][kind] > 0 for kind in (ANSWERS_CALL, UNASKED))
    assert set(model.sets) == set(SET_FEATURES) and model.info["encoder"] == "all-minilm-l6-v2.f16.gguf"
    scores = RankerScorer(out).score(FILLER, "parse the config file")
    assert int(np.argmax(scores)) == 1


def test_units_that_match_nothing_are_ranked_alike_wherever_they_stand() -> None:
    units = [*FILLER, "def compute_invoice_total(items):\n    return sum(items)\n", *FILLER]
    x = ranker_features(units, "compute_invoice_total")
    for name in ("bm25_density_rank", "bm25_rank", "line_bm25_rank"):
        col = x[:, FEATURES.index(name)]
        unmatched = np.delete(col, len(FILLER))
        assert np.allclose(unmatched, unmatched[0]), name  # first or last, the same rank
        assert col[len(FILLER)] == 1.0


def test_a_request_sharing_no_word_with_the_output_is_served_whole() -> None:
    """Length alone must not choose what to keep: no evidence, no compression (as with BM25)."""
    from gateway.compressor import CompressionSettings, MessageCompressor
    from policies.conversation_types import Message

    output = "".join(f"def handler_{i}(event):\n    return route(event, {i})\n\n" for i in range(300))
    assert RankerScorer().score(FILLER, "zzqx wvut") == [0.0] * len(FILLER)
    settings = CompressionSettings(100, "100:0.3 100000:0.3", 8, 64, 128, 0.11)
    compressor = MessageCompressor(lambda text: len(text.split()), bundle_of(RankerScorer()), settings)
    messages = [Message("user", "Qu'est-ce qui ne va pas ?"), Message("tool", output, tool_call_id="c1")]
    plan, report = compressor.compress(messages, 1, len(output.split()))
    assert not plan.compressed and plan.text == output and report.reason.startswith("scorer_failed")
    messages[0] = Message("user", "Which handler routes event 217?")
    plan, _ = compressor.compress(messages, 1, len(output.split()))
    assert plan.compressed and "def handler_217(event):" in plan.text


def test_the_compressor_scores_unasked_transcripts_with_the_unasked_weights() -> None:
    """A tool output answering a found call gets the call's weights, even when it reads as a transcript;
    a transcript without its call (a session log after the task) gets the unasked set; a single output
    without its call is no transcript and keeps the call's weights."""
    from gateway.compressor import CompressionSettings, MessageCompressor
    from policies.conversation_types import Message, ToolCall

    class Recording:
        def __init__(self, name: str) -> None:
            self.name, self.calls = name, 0

        def score(self, units: list[str], request: str) -> list[float]:
            self.calls += 1
            return [1.0 if "handler_217" in u else 0.0 for u in units]

    asked, unasked = Recording("ranker"), Recording("ranker")
    single = "".join(f"def handler_{i}(event):\n    return route(event, {i})\n\n" for i in range(300))
    log = "".join(f"$ sed -n '{i},{i + 1}p' app.py\ndef handler_{i}(event):\n    return route(event, {i})\n"
                  for i in range(300))
    settings = CompressionSettings(100, "100:0.3 100000:0.3", 8, 64, 128, 0.11)
    compressor = MessageCompressor(lambda text: len(text.split()), ScorerBundle(asked, unasked, asked), settings)
    call = Message("assistant", "", (ToolCall("c1", "bash", '{"command": "grep -n handler_217 -A1 app.py"}'),))
    task = Message("user", "Which handler routes event 217?")
    for output, with_call, expected in ((log, True, (1, 0)), (log, False, (1, 1)), (single, False, (2, 1))):
        messages = [task, call, Message("tool", output, tool_call_id="c1", name="bash")] if with_call else \
            [task, Message("tool", output, tool_call_id="c9", name="bash")]
        plan, _ = compressor.compress(messages, len(messages) - 1, len(output.split()))
        assert plan.compressed and (asked.calls, unasked.calls) == expected, (with_call, expected)


def test_the_compressor_plans_with_its_scorers_size_exponent(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranker's chosen exponent reaches the planner; a scorer that declares none plans per token."""
    import gateway.compressor as compressor_module
    from gateway.compressor import CompressionSettings, MessageCompressor
    from policies.conversation_types import Message

    planned: list[float] = []
    real_plan = compressor_module.plan_compression

    def recording_plan(*args: object, **kwargs: object) -> object:
        planned.append(float(args[-1]))  # type: ignore[arg-type]
        return real_plan(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(compressor_module, "plan_compression", recording_plan)
    output = "".join(f"def handler_{i}(event):\n    return route(event, {i})\n\n" for i in range(300))
    messages = [Message("user", "Which handler routes event 217?"), Message("user", output)]
    settings = CompressionSettings(100, "100:0.3 100000:0.3", 8, 64, 128, 0.11)
    ranker = RankerScorer()
    for scorer, expected in ((ranker, ranker.size_exponent), (Bm25Scorer(), 1.0)):
        compressor = MessageCompressor(lambda text: len(text.split()), ScorerBundle(scorer, scorer, scorer), settings)
        compressor.compress(messages, 1, len(output.split()))
        assert planned[-1] == expected
    assert ranker.size_exponent != 1.0  # the shipped weights chose their own
