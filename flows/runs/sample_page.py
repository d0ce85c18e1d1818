"""One step's samples as a self-contained HTML page (``ppoflow inspect RUN --step K --html OUT``,
and ``samples/step_<K>.html`` in MLflow at the steps a training logs its generations table).

The page holds its data as JSON and renders it with its own script (no network, no external
file): one card per sample in generation order — the prompt, the response token by token, the
score, the mean advantage, the group (``uid``) — with each response token coloured by the
channel chosen at the top:

- ``advantage``: the token's advantage, diverging: red below 0, white at 0, green above, full
  colour at ± the largest |advantage| of the page's sampled tokens;
- ``ratio``: the trainer's probability of the token over the rollout's (exp(old − rollout
  log-prob)), diverging on log ratio, full colour at ± the largest |log ratio|; only when the
  step recomputed its old log-probs;
- ``log_prob``: the rollout's log-probability of the token, white at 0 (certain) to orange at
  the page's lowest (most surprising);
- ``entropy``: the entropy (nats) of the trainer's distribution at the token's position, at the
  rollout temperature, white at 0 (one choice) to blue at the page's largest; only when the
  step recomputed its old log-probs (their stage keeps it, stages/old_log_prob.py);
- ``policy_version``: for a partial rollout (flows/partial_rollout.py), the version of the
  weights that chose the token, white at 0 to blue at the page's newest.

Tokens the model did not sample (a tool's turn: ``response_mask`` 0) are grey and uncoloured.
The page filters the cards by score range and by group; the address's fragment can set the
controls (``page.html#ratio&group=<uid>&lo=0.5``: the channel, then ``id=value`` pairs). :func:`token_colour` is the colour
formula; the page's script computes the same one (tests compare the two in headless Chromium).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from typing import Any

from flows.runs.samples import Decoder, Sample, StepSamples

#: channel → (label, kind); kind "diverging" colours sign and size, "surprise" −log p,
#: "spread" a value ≥ 0
CHANNELS: dict[str, tuple[str, str]] = {
    "advantage": ("advantage", "diverging"),
    "ratio": ("trainer / rollout probability", "log-diverging"),
    "log_prob": ("rollout log-prob", "surprise"),
    "entropy": ("trainer entropy (nats)", "spread"),
    "policy_version": ("policy version (partial rollouts)", "spread"),
}
POSITIVE, NEGATIVE, SURPRISE, SPREAD = (46, 160, 67), (215, 58, 73), (230, 126, 34), (52, 101, 164)


def _mix(target: tuple[int, int, int], t: float) -> str:
    """White mixed with ``target`` by ``t`` ∈ [0, 1], rounded half up (as the page's Math.round)."""
    return "rgb({}, {}, {})".format(*(math.floor(255 + (c - 255) * t + 0.5) for c in target))


def channel_value(channel: str, value: float) -> float:
    """The number a channel colours: the value, or its log for ``ratio``."""
    if CHANNELS[channel][1] != "log-diverging":
        return value
    return math.log(value) if value > 0 else -math.inf


def token_colour(channel: str, value: float, scale: float) -> str:
    """The CSS colour of a sampled token's ``value`` on ``channel`` at the page's ``scale``.

    >>> token_colour("advantage", 1.0, 2.0), token_colour("advantage", -4.0, 2.0)
    ('rgb(151, 208, 161)', 'rgb(215, 58, 73)')
    >>> token_colour("log_prob", 0.0, 3.0), token_colour("entropy", 1.0, 2.0)
    ('rgb(255, 255, 255)', 'rgb(154, 178, 210)')
    """
    v = channel_value(channel, value)
    if scale <= 0 or not math.isfinite(v):
        return _mix(POSITIVE, 0.0)
    if CHANNELS[channel][1] == "surprise":
        return _mix(SURPRISE, min(max(-v / scale, 0.0), 1.0))
    if CHANNELS[channel][1] == "spread":
        return _mix(SPREAD, min(max(v / scale, 0.0), 1.0))
    t = min(max(v / scale, -1.0), 1.0)
    return _mix(POSITIVE, t) if t >= 0 else _mix(NEGATIVE, -t)


def channel_scale(channel: str, samples: Sequence[Sample]) -> float:
    """Full colour's value: the largest |value| (diverging, spread; −value for ``log_prob``)
    over the sampled tokens of ``samples``; 0 when there is none."""
    values = [
        channel_value(channel, value)
        for sample in samples
        for value, sampled in zip(
            sample.tokens.get(channel, []), sample.response_mask, strict=False
        )
        if sampled
        and math.isfinite(value)
        and (value > 0 or CHANNELS[channel][1] != "log-diverging")
    ]
    if not values:
        return 0.0
    if CHANNELS[channel][1] == "surprise":
        return max(0.0, max(-v for v in values))
    return max(abs(v) for v in values)


def _finite(value: float | None) -> float | None:
    """``value``, or None for NaN / ±Inf (JSON has neither)."""
    return value if value is not None and math.isfinite(value) else None


def _token_texts(decoder: Decoder, ids: Sequence[int]) -> list[str]:
    if decoder.tokenizer is None:
        return [f"<{i}>" for i in ids]
    return [decoder.tokenizer.decode([i], skip_special_tokens=False) for i in ids]


def page_data(found: StepSamples, decoder: Decoder) -> dict[str, Any]:
    """The JSON the page renders: the step, the channels present with their scales, and per
    sample its row, group, score, mean advantage, prompt text and tokens."""
    present = [c for c in CHANNELS if any(c in s.tokens for s in found.samples)]
    return {
        "run": found.run_dir,
        "step": found.step,
        "score_source": found.score_source,
        "channels": {
            c: {
                "label": CHANNELS[c][0],
                "kind": CHANNELS[c][1],
                "scale": channel_scale(c, found.samples),
            }
            for c in present
        },
        "colours": {
            "positive": POSITIVE,
            "negative": NEGATIVE,
            "surprise": SURPRISE,
            "spread": SPREAD,
        },
        "samples": [
            {
                "row": s.row,
                "uid": s.columns.get("uid", ""),
                "score": _finite(s.score),
                "advantage": _finite(s.advantage),
                "prompt": decoder.text(s.prompt_ids),
                "tokens": [
                    {
                        "t": text,
                        "m": int(sampled),
                        **{c: _finite(s.tokens[c][i]) for c in present if c in s.tokens},
                    }
                    for i, (text, sampled) in enumerate(
                        zip(_token_texts(decoder, s.response_ids), s.response_mask, strict=True)
                    )
                ],
            }
            for s in found.samples
        ],
    }


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>ppoflow · step {step} samples</title>
<style>
body {{ font: 14px/1.45 system-ui, sans-serif; margin: 1.5em; color: #222; }}
header {{ margin-bottom: 1em; }}
.controls label {{ margin-right: 1.2em; }}
.card {{ border: 1px solid #ddd; border-radius: 6px; padding: .6em .8em; margin: .6em 0; }}
.meta {{ color: #555; font-size: 12px; margin-bottom: .3em; }}
.prompt {{ color: #555; white-space: pre-wrap; font-family: ui-monospace, monospace; }}
.response {{ white-space: pre-wrap; font-family: ui-monospace, monospace; }}
.tok {{ border-radius: 2px; }}
.tool {{ background: #e6e6e6; color: #777; }}
.legend span {{ display: inline-block; padding: 0 .5em; }}
input[type=number] {{ width: 6em; }}
select {{ max-width: 22em; }}
</style></head>
<body>
<header><h2>step {step} · {count} samples</h2>
<div class="meta">{run} · score: {score_source}</div>
<div class="controls">
<label>colour by <select id="channel"></select></label>
<label>score ≥ <input id="lo" type="number" step="any" size="6"></label>
<label>score ≤ <input id="hi" type="number" step="any" size="6"></label>
<label>group <select id="group"><option value="">all</option></select></label>
<span id="shown"></span></div>
<div class="legend" id="legend"></div></header>
<main id="cards"></main>
<script type="application/json" id="data">{data}</script>
<script>
const data = JSON.parse(document.getElementById("data").textContent);
const mix = (c, t) => "rgb(" + c.map(v => Math.round(255 + (v - 255) * t)).join(", ") + ")";
function colour(channel, value) {{
  const info = data.channels[channel];
  const v = info.kind === "log-diverging" ? Math.log(value) : value;
  if (!(info.scale > 0) || !isFinite(v)) return mix(data.colours.positive, 0);
  if (info.kind === "surprise") return mix(data.colours.surprise, Math.min(Math.max(-v / info.scale, 0), 1));
  if (info.kind === "spread") return mix(data.colours.spread, Math.min(Math.max(v / info.scale, 0), 1));
  const t = Math.min(Math.max(v / info.scale, -1), 1);
  return t >= 0 ? mix(data.colours.positive, t) : mix(data.colours.negative, -t);
}}
const fmt = v => v === null ? "-" : Number(v).toPrecision(4);
const channel = document.getElementById("channel"), group = document.getElementById("group");
for (const name of Object.keys(data.channels)) channel.add(new Option(data.channels[name].label, name));
for (const uid of [...new Set(data.samples.map(s => s.uid))]) group.add(new Option(uid, uid));
const cards = document.getElementById("cards");
for (const s of data.samples) {{
  const card = document.createElement("div");
  card.className = "card"; card.dataset.row = s.row; card.dataset.uid = s.uid;
  card.dataset.score = s.score === null ? "" : s.score;
  card.innerHTML = '<div class="meta">row ' + s.row + " · group " + s.uid + " · score " +
    fmt(s.score) + " · advantage " + fmt(s.advantage) + "</div>";
  const prompt = document.createElement("div");
  prompt.className = "prompt"; prompt.textContent = s.prompt; card.appendChild(prompt);
  const response = document.createElement("div");
  response.className = "response";
  s.tokens.forEach((tok, i) => {{
    const span = document.createElement("span");
    span.className = tok.m ? "tok" : "tok tool"; span.textContent = tok.t;
    span.dataset.pos = i; span.tok = tok; response.appendChild(span);
  }});
  card.appendChild(response); cards.appendChild(card);
}}
function paint() {{
  const name = channel.value, info = data.channels[name];
  for (const span of document.querySelectorAll(".tok")) {{
    const value = span.tok[name];
    span.style.background = span.tok.m && value !== undefined ? colour(name, value) : "";
    span.title = info.label + " " + fmt(value === undefined ? null : value);
  }}
  document.getElementById("legend").textContent = info.label + ": full colour at " +
    ({{surprise: "log-prob −", spread: ""}}[info.kind] ?? "± ") + fmt(info.scale) +
    (info.kind === "log-diverging" ? " (log ratio)" : "");
}}
function filter() {{
  const lo = parseFloat(document.getElementById("lo").value), hi = parseFloat(document.getElementById("hi").value);
  let shown = 0;
  for (const card of cards.children) {{
    const score = card.dataset.score === "" ? NaN : parseFloat(card.dataset.score);
    const keep = (isNaN(lo) || score >= lo) && (isNaN(hi) || score <= hi) &&
      (!group.value || card.dataset.uid === group.value);
    card.style.display = keep ? "" : "none"; shown += keep;
  }}
  document.getElementById("shown").textContent = shown + " of " + data.samples.length + " shown";
}}
channel.onchange = paint;
for (const id of ["lo", "hi", "group"]) document.getElementById(id).oninput = filter;
for (const part of location.hash.slice(1).split("&").filter(Boolean)) {{
  const [key, value] = part.includes("=") ? part.split("=") : ["channel", part];
  const input = document.getElementById(key);
  if (input) input.value = decodeURIComponent(value);
}}
paint(); filter(); document.body.dataset.rendered = "true";
</script></body></html>
"""


def render_page(found: StepSamples, decoder: Decoder) -> str:
    """The step's page (module docstring)."""
    data = page_data(found, decoder)
    text = json.dumps(data, ensure_ascii=False, allow_nan=False).replace("</", "<\\/")
    return PAGE.format(
        step=found.step,
        count=len(found.samples),
        run=html.escape(found.run_dir),
        score_source=html.escape(found.score_source),
        data=text,
    )
