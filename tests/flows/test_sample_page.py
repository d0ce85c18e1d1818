"""The sample page (flows/runs/sample_page.py): its data, its colours, and the page as headless
Chromium renders it — every sampled token's colour is the formula's for its value."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from flows.runs.sample_page import channel_scale, page_data, render_page, token_colour
from flows.runs.samples import Decoder, Sample, StepSamples


class LetterTokenizer:
    """Token id i is the letter chr(97 + i)."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(97 + i) for i in ids)


def sample(row, uid, score, advantages, log_probs, ratios, mask=None) -> Sample:
    n = len(advantages)
    entropies = [round(-0.5 * value, 3) for value in log_probs]  # any values ≥ 0
    versions = [float(2 * row)] * (n - 1) + [float(2 * row + 1)]  # a partial rollout's last token
    return Sample(
        row=row,
        batch_row=row,
        prompt_ids=[0, 1],
        response_ids=list(range(2, 2 + n)),
        response_mask=mask or [1] * n,
        score=score,
        advantage=sum(advantages) / n,
        extras={},
        columns={"uid": uid},
        tokens={
            "advantage": advantages,
            "log_prob": log_probs,
            "ratio": ratios,
            "entropy": entropies,
            "policy_version": versions,
        },
    )


def step_samples() -> StepSamples:
    return StepSamples(
        run_dir="/runs/demo",
        step=3,
        samples=[
            sample(0, "g1", 1.0, [0.8, 0.8, 0.8], [-0.1, -2.0, -0.5], [1.0, 1.2, 0.9]),
            sample(1, "g1", 0.0, [-0.8, -0.8, -0.8], [-3.0, -0.2, -1.0], [0.5, 1.0, 1.0]),
            sample(2, "g2", 0.5, [0.0, 0.4, 9.0], [-0.3, -0.3, -50.0], [1.0, 2.0, 1.0], [1, 1, 0]),
        ],
        score_source="reward.seq_scores",
        reordered_by=["balance"],
    )


def test_the_scales_are_over_the_sampled_tokens_only():
    found = step_samples().samples
    assert channel_scale("advantage", found) == 0.8  # 9.0 is a tool token (mask 0)
    assert channel_scale("log_prob", found) == 3.0
    assert channel_scale("ratio", found) == pytest.approx(math.log(2.0))
    assert channel_scale("entropy", found) == 1.5  # 25.0 is the tool token's
    assert channel_scale("policy_version", found) == 4.0  # 5.0 is the tool token's


def test_the_page_data_holds_every_sample_and_token():
    data = page_data(step_samples(), Decoder(LetterTokenizer(), None))
    assert [s["row"] for s in data["samples"]] == [0, 1, 2]
    first = data["samples"][0]
    assert first["prompt"] == "ab" and [t["t"] for t in first["tokens"]] == ["c", "d", "e"]
    assert first["tokens"][1] == {
        "t": "d",
        "m": 1,
        "advantage": 0.8,
        "log_prob": -2.0,
        "ratio": 1.2,
        "entropy": 1.0,
        "policy_version": 0.0,
    }
    assert data["samples"][2]["tokens"][2]["m"] == 0
    assert set(data["channels"]) == {"advantage", "ratio", "log_prob", "entropy", "policy_version"}
    assert data["channels"]["entropy"]["kind"] == "spread"


def test_the_page_is_self_contained():
    page = render_page(step_samples(), Decoder(LetterTokenizer(), None))
    assert not re.search(r"""(src|href)=["']?https?:""", page)  # nothing fetched
    assert "<script src" not in page and "<link" not in page
    embedded = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    assert len(json.loads(embedded.group(1))["samples"]) == 3


class Spans(HTMLParser):
    """Each card's token spans from a rendered DOM: (row, position, class, background)."""

    def __init__(self) -> None:
        super().__init__()
        self.row: str | None = None
        self.spans: list[tuple[int, int, str, str]] = []
        self.cards: list[tuple[int, str]] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "card" in (attrs.get("class") or "").split():
            self.row = attrs["data-row"]
            self.cards.append((int(self.row), attrs.get("style") or ""))
        if tag == "span" and "tok" in (attrs.get("class") or "").split():
            style = attrs.get("style") or ""
            background = re.search(r"background:\s*([^;]+)", style)
            self.spans.append(
                (
                    int(self.row),
                    int(attrs["data-pos"]),
                    attrs["class"],
                    background.group(1).strip() if background else "",
                )
            )


def chromium() -> str:
    found = (
        os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    )
    if found is None:
        pytest.skip(
            "no Chromium on this machine (set CHROMIUM to its path): the page is checked in a "
            "headless browser; its data and colour formula are checked above"
        )
    return found


def rendered(page: Path, fragment: str = "") -> Spans:
    done = subprocess.run(
        [chromium(), "--headless", "--disable-gpu", "--no-sandbox", "--virtual-time-budget=5000",
         "--dump-dom", f"file://{page}{fragment}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert 'data-rendered="true"' in done.stdout, "the page's script did not finish"
    parsed = Spans()
    parsed.feed(done.stdout)
    return parsed


@pytest.mark.parametrize("channel", ["advantage", "log_prob", "ratio", "entropy", "policy_version"])
def test_in_chromium_every_sampled_token_has_the_colour_of_its_value(tmp_path, channel):
    found = step_samples()
    page = tmp_path / "step_3.html"
    page.write_text(render_page(found, Decoder(LetterTokenizer(), None)), encoding="utf-8")
    parsed = rendered(page, f"#{channel}")
    scale = channel_scale(channel, found.samples)
    assert len(parsed.spans) == 9
    for row, pos, classes, background in parsed.spans:
        s = found.samples[row]
        if s.response_mask[pos]:
            assert background == token_colour(channel, s.tokens[channel][pos], scale), (row, pos)
        else:
            assert "tool" in classes and background == ""  # a tool's token: not coloured


def test_in_chromium_the_group_filter_hides_the_other_groups(tmp_path):
    page = tmp_path / "step_3.html"
    page.write_text(render_page(step_samples(), Decoder(LetterTokenizer(), None)), encoding="utf-8")
    parsed = rendered(page, "#advantage&group=g2")
    assert [(row, "none" in style) for row, style in parsed.cards] == [
        (0, True),
        (1, True),
        (2, False),
    ]
