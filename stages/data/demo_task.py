"""The built-in demo task "ppoflow/demo-copy": repeat the letter(s) of the prompt.

Each prompt is one user message ``"copy: <answer>"``; the answer is ``answer_length`` letters drawn
uniformly from ``alphabet`` (default ``"abcdefgh"``) and is the ground truth. With the tiny
tokenizer the prompt reads ``<|user|>copy: c<|assistant|>`` and the ideal response is
``c<|endoftext|>``. ``extra_info`` carries the alphabet so the scorer knows it.

Score (``compute_score``, verl's custom-reward signature, returns ``{"score", "acc", "pred"}``),
for a decoded response ``s`` and an answer ``a`` of k letters:
- the credit of a character ``c`` for an answer letter ``t``: 1 if ``c == t``;
  ``NEAR_CREDIT · (1 − d / ⌊|alphabet| / 2⌋)`` if ``c`` is another letter of the alphabet at
  *cyclic* distance ``d`` from ``t`` (so the opposite letter earns 0); 0 for any other character;
- every character of the response is scored against the answer repeated (``a[j mod k]`` at
  position j), missing answer positions of a short response count 0:
  ``match = Σ_{j < n} credit(s[j], a[j mod k]) / n`` with ``n = max(len(s), k)``
  (:func:`copy_match`);
- ``score = match · (1 − STOP_WEIGHT · min(1, extra / STOP_SPAN))`` with
  ``extra = max(0, len(s) − k)``, the characters written after the answer: stopping right after
  the answer keeps the whole match, and each character more loses ``STOP_WEIGHT / STOP_SPAN`` of
  it, up to ``STOP_WEIGHT`` (0.4) at ``STOP_SPAN`` (15) characters, the most a 16-token demo
  response holds. The reward loop decodes the valid response with special tokens skipped, so a
  response that stopped right after the answer decodes to exactly k characters (EOS came next).
  So ``"c"`` scores 1.0, ``"cccc"`` 0.92, ``"c"`` repeated 16 times 0.6 and ``"cxyz"`` 0.23;
- ``acc`` = 1.0 when the first k characters equal the answer (stopping not required), ``pred`` =
  those characters (used by maj@N).

Why this shape (RL with GRPO, n = 4, on a *randomly initialised* tiny model):
- Prompt dependence. The near-miss credit is cyclic, so every letter has the same expected
  credit under uniformly drawn answers, ``(1 + NEAR_CREDIT · (⌊m/2⌋ − 1)) / m`` for m letters
  (0.3125 for 8): a policy that ignores the prompt scores at most that (per character, whatever
  it emits) and its acc is chance (1/8). Only reading the prompt raises the score, up to 1.0.
  (A plain code-point distance would make the middle letter a good constant answer, and RL
  collapses onto it: measured.)
- Dense signal from random init. The model samples its 261 tokens almost uniformly, so exact
  matches are rare; the near-miss credit over *every* response character makes the four scores
  of a group differ in most groups (84% of groups of 16 uniform random bytes, vs 1.6% for an
  exact match of the first character), and every sampled token carries a prompt-dependent
  reward, not only the first (scoring only the first character left 15 of 16 response tokens as
  pure noise, and the policy collapsed onto one letter).
- Stopping is learned because the loss grows with every extra character. An earlier scorer
  took a flat 0.2 from any response that did not stop right after the answer: an EOS at exactly
  that place is rarely sampled, so the policy learned to repeat the letter to the 16-token limit
  (greedy ``gggggggggggggggg``, 0.8; 99 % of responses clipped) and almost never to stop.
  Graded, a response that happens to stop early beats one that runs to the limit, so GRPO's
  groups see the difference from the first steps. The weight matters, measured through
  ``ppoflow train configs/demo-cpu.yaml`` (64 prompts per step, lr 3e-4, one update per step)
  with the greedy validation at step 200 (stopping = mean response length near 2 tokens,
  letter and EOS): 0.2 and 0.3 never stop (acc 0.94, the letter repeated; with 0.3 still none
  at step 300, entropy 0.2); 0.45 and 0.5 stop by step 175 but before they copy, and then copy
  slowly (acc 0.55); 0.4 copies first (acc 0.84 at step 200) and then stops (response length
  2.2 tokens at step 225). The shipped configs/demo-cpu.yaml trains 250 steps with 0.4:
  validation score 0 → 0.20 (step 25, the plateau) → 0.61 / acc 0.84 (step 200) → 0.96 / acc
  0.94 (step 250, greedy ``c`` then EOS for 7 of the 8 letters).
- Longer answers (``answer_length`` > 1) use the same scorer; their learning speed is not
  measured (expect it slower: each position needs its own copy).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

DATA_SOURCE = "ppoflow/demo-copy"
ABILITY = "copy"
DEFAULT_ALPHABET = "abcdefgh"
NEAR_CREDIT = 0.5  # credit scale of a near-miss letter (cyclic distance 1 earns 0.75 of it)
STOP_WEIGHT = 0.4  # share of the match lost by a response STOP_SPAN or more characters too long
STOP_SPAN = 15  # extra characters over which that share grows linearly


def char_credit(char: str | None, target: str, alphabet: str = DEFAULT_ALPHABET) -> float:
    """Credit of one response character for one answer letter (cyclic near-miss credit).

    Example:
        >>> [char_credit(c, "a") for c in "abcdeh"]
        [1.0, 0.375, 0.25, 0.125, 0.0, 0.375]
        >>> char_credit("~", "a"), char_credit(None, "a")
        (0.0, 0.0)
    """
    if char is None or char not in alphabet:
        return 0.0
    if char == target:
        return 1.0
    half = len(alphabet) // 2
    distance = abs(alphabet.index(char) - alphabet.index(target))
    distance = min(distance, len(alphabet) - distance)
    return NEAR_CREDIT * max(0.0, 1.0 - distance / half)


def copy_match(text: str, answer: str, alphabet: str = DEFAULT_ALPHABET) -> float:
    """The mean credit of ``text``'s characters against ``answer`` repeated, over
    ``max(len(text), len(answer))`` positions (a missing answer position counts 0).

    Example:
        >>> copy_match("cccc", "c"), copy_match("cx", "c"), copy_match("a", "ab")
        (1.0, 0.5, 0.5)
    """
    k = len(answer)
    n = max(len(text), k)
    chars = [text[j] if j < len(text) else None for j in range(n)]
    return sum(char_credit(c, answer[j % k], alphabet) for j, c in enumerate(chars)) / n


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None
) -> dict[str, Any]:
    """Score a decoded response against the answer letters (rules in the module docstring).

    Example:
        >>> compute_score(DATA_SOURCE, "c", "c")
        {'score': 1.0, 'acc': 1.0, 'pred': 'c'}
        >>> [round(compute_score(DATA_SOURCE, s, "c")["score"], 4) for s in ("cccc", "c" * 16, "cxyz")]
        [0.92, 0.6, 0.23]
        >>> compute_score(DATA_SOURCE, "d", "c")["score"], compute_score(DATA_SOURCE, "", "c")["score"]
        (0.375, 0.0)
    """
    if data_source != DATA_SOURCE:
        raise ValueError(f"demo scorer got data_source={data_source!r}; it scores {DATA_SOURCE!r}")
    alphabet = (extra_info or {}).get("alphabet") or DEFAULT_ALPHABET
    answer = str(ground_truth)
    if not answer or any(t not in alphabet for t in answer):
        raise ValueError(
            f"demo scorer got ground_truth={ground_truth!r}; expected letters of {alphabet!r}"
        )
    match = copy_match(solution_str, answer, alphabet)
    extra = max(0, len(solution_str) - len(answer))
    score = match * (1.0 - STOP_WEIGHT * min(1.0, extra / STOP_SPAN))
    pred = solution_str[: len(answer)]
    return {"score": score, "acc": float(pred == answer), "pred": pred}


def make_demo_rows(
    n: int,
    *,
    seed: int,
    split: str,
    answer_length: int = 1,
    max_answer_length: int | None = None,
    alphabet: str = DEFAULT_ALPHABET,
) -> list[dict[str, Any]]:
    """``n`` verl-layout records of the demo task, drawn from ``random.Random(seed)``.

    Each answer has ``answer_length`` letters, or with ``max_answer_length`` a length drawn
    uniformly from ``answer_length … max_answer_length`` per row (prompts of varied lengths, as
    real data has; the draw comes before the row's letters, so without it the rows are the
    same as before the option existed)."""
    longest = answer_length if max_answer_length is None else max_answer_length
    if (
        n < 0
        or not 1 <= answer_length <= longest
        or len(alphabet) < 2
        or len(set(alphabet)) != len(alphabet)
    ):
        raise ValueError(
            f"need n >= 0, 1 <= answer_length <= max_answer_length and >= 2 letters without "
            f"repeats; got n={n}, answer_length={answer_length}, "
            f"max_answer_length={max_answer_length}, alphabet={alphabet!r}"
        )
    rng = random.Random(seed)
    rows = []
    for index in range(n):
        length = answer_length if max_answer_length is None else rng.randint(answer_length, longest)
        answer = "".join(rng.choice(alphabet) for _ in range(length))
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"copy: {answer}"}],
                "ability": ABILITY,
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": index, "alphabet": alphabet},
            }
        )
    return rows


def make_demo_data(
    directory: str | Path,
    *,
    n_train: int = 1024,
    n_val: int = 64,
    seed: int = 0,
    answer_length: int = 1,
    max_answer_length: int | None = None,
    alphabet: str = DEFAULT_ALPHABET,
) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet`` of the demo task; return their paths.

    The two splits are drawn from independent streams (seed and seed + 1).
    """
    # imported here: the scorer's workers import this module for compute_score alone, and
    # the writer would bring numpy, pyarrow and fsspec into every one of them
    from stages.data.dataset import write_prompt_rows

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = directory / "train.parquet", directory / "val.parquet"
    for path, n, split_seed, split in (
        (paths[0], n_train, seed, "train"),
        (paths[1], n_val, seed + 1, "val"),
    ):
        rows = make_demo_rows(
            n,
            seed=split_seed,
            split=split,
            answer_length=answer_length,
            max_answer_length=max_answer_length,
            alphabet=alphabet,
        )
        write_prompt_rows(path, rows)
    return paths
