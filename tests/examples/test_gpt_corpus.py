"""examples/gpt_parts.py's corpora: the Markov text the small GPT cannot memorise, and
train_gpt.py's --corpus."""

from __future__ import annotations

import collections
import math
import subprocess
import sys

import pytest

from tests.helpers.examples import EXAMPLES, load_example

parts = load_example("gpt_parts")


def conditional_entropy(text: str, order: int) -> float:
    """Nats a character given the ``order`` before it, estimated from the text's own counts."""
    contexts = collections.Counter(text[i:i + order] for i in range(len(text) - order))
    joint = collections.Counter(text[i:i + order + 1] for i in range(len(text) - order))
    n = len(text) - order
    return -sum(c / n * math.log(c / contexts[k[:order]]) for k, c in joint.items())


def test_markov_text_is_deterministic_long_and_in_texts_alphabet():
    text = parts.corpus("markov")
    assert len(text) == 200_000
    assert parts.markov_text() == text            # same on every rank: a fixed seed
    assert parts.markov_text(seed=1) != text
    assert set(text) == set(parts.TEXT)           # same vocabulary as the built-in text
    assert parts.corpus("builtin") == parts.TEXT


def test_markov_text_has_entropy_that_the_built_in_text_lacks():
    markov = parts.corpus("markov")
    repeated = parts.TEXT * (len(markov) // len(parts.TEXT))
    # The built-in text, repeated, is nearly predictable from three characters; the chain's
    # text keeps over a nat a character (its order-2 chain has about 1.65).
    assert conditional_entropy(repeated, 3) < 0.3
    assert conditional_entropy(markov, 2) > 1.5
    assert conditional_entropy(markov, 3) > 1.2
    assert parts.TEXT[:200] not in markov


def test_batches_cut_windows_of_the_corpus_in_its_alphabet():
    text = parts.corpus("markov")
    alphabet = sorted(set(text))
    x, y = parts.batches(text, 16, 3, seed=7, step=5)
    assert x.shape == y.shape == (3, 16)
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        window = "".join(alphabet[i] for i in row_x)
        start = text.find(window)
        assert start >= 0
        assert "".join(alphabet[i] for i in row_y) == text[start + 1:start + 17]


def test_an_unknown_corpus_is_refused():
    with pytest.raises(ValueError, match="corpus must be one of builtin, markov"):
        parts.corpus("shakespeare")


@pytest.mark.process
def test_train_gpt_refuses_an_unknown_corpus_in_one_line_with_exit_2():
    proc = subprocess.run([sys.executable, str(EXAMPLES / "train_gpt.py"), "--steps", "1",
                           "--corpus", "shakespeare"], env={"PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--corpus: invalid choice: 'shakespeare'" in proc.stderr.strip().splitlines()[-1]


@pytest.mark.process
def test_train_gpt_trains_on_the_markov_corpus():
    from lab.train import run_placement

    run = run_placement([["a"]], steps=3, layers=2, args=["--corpus", "markov"])
    assert run.ok, run.failure()
    assert len(run.loss) == 3 and all(math.isfinite(v) for v in run.loss)
    # Before learning anything the loss is about ln(vocabulary): the model saw TEXT's alphabet.
    assert abs(run.loss[0] - math.log(len(set(parts.TEXT)))) < 1.0
