"""The phrase-ban matcher's cost per generated token: `find` + `holdback` of one row's matcher, called after every
token of a 2000-token SmolLM2 text (the start of the tiny model's held-out documentation text) with the growing
token list, for 50 banned phrases, and the same with 50 regular expressions. Prints the median and the 99th
percentile in microseconds per token.

    python benchmarks/bench_banned_strings.py
    python benchmarks/bench_banned_strings.py --tokens 4000 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from samplechain_banned_strings_match import PhraseMatcher

ROOT = Path(__file__).resolve().parents[1]

# slop phrases, and phrases that begin like the documentation text does (so prefixes are often pending)
PHRASES = [
    "shivers down her spine", "a testament to", "barely above a whisper", "tapestry of", "delve into",
    "in the realm of", "it is important to note", "ministrations", "a stark reminder", "sent shivers",
    "the object is then asked", "the primary must be", "attribute references are", "this production is",
    "the value produced by", "may yield the same", "most objects are", "an attribute error", "the method returns",
    "a period and a dot", "evaluate to nothing", "determined by fate", "customized by hand", "multiple times over",
    "references to the past", "the identifier is", "which most people do", "the type of person",
    "is then asked to", "produce the best", "a primary school", "supports the idea", "the name of the game",
    "the following example", "in order to", "as well as the", "a list of lists", "the same object twice",
    "a new instance", "the default value", "an exception is raised", "the result is", "a dictionary of",
    "when the function", "for example the", "the built-in function", "is equivalent to the", "a sequence of",
    "the corresponding", "at the end of the day",
]  # fmt: skip
REGEXES = [r"(?:shivers|chills) (?:down|up) (?:her|his) spine", r"a testament to \w+", r"\bdelve(?:s|d)? into"]


def text_tokens(count: int) -> tuple[list[int], list[bytes]]:
    from transformers import AutoTokenizer

    from samplechain.models import default_gguf_path, gguf_tokenizer_path
    from samplechain.strings import byte_table

    tokenizer = AutoTokenizer.from_pretrained(gguf_tokenizer_path(default_gguf_path()), local_files_only=True)
    text = (ROOT / "core" / "samplechain" / "models" / "docs-gpt2" / "held_out.txt").read_text(encoding="utf-8")
    ids = tokenizer.encode(text, add_special_tokens=False)
    while len(ids) < count:
        ids = ids + ids
    return ids[:count], list(byte_table(tokenizer).pieces)


def per_token_us(make, ids: list[int], rounds: int) -> list[float]:
    """find + holdback after each token; a hit is let stand (the calls look past it), as a loop does once it
    gives up rewinding, so the text stays the same for every case."""
    times = []
    for _ in range(rounds):
        matcher, row, floor = make(), [], 0
        for token in ids:
            row.append(token)
            start = time.perf_counter()
            hit = matcher.find(row, from_char=floor)
            if hit is not None:
                floor = hit.start_char + 1
            matcher.holdback(row, from_char=floor)
            times.append(time.perf_counter() - start)
    return [t * 1e6 for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ids, pieces = text_tokens(args.tokens)
    regexes = [*REGEXES, *(p.replace(" ", r"\s+") for p in PHRASES[: 50 - len(REGEXES)])]
    cases = {
        "50 phrases": lambda: PhraseMatcher(PHRASES, pieces),
        "50 phrases, ignore_case + whole_words": lambda: PhraseMatcher(
            PHRASES, pieces, ignore_case=True, whole_words=True
        ),
        "50 regexes": lambda: PhraseMatcher(regexes, pieces, regex=True),
    }
    print(f"find + holdback per token, {len(ids)} SmolLM2 tokens, {args.rounds} rounds")
    for name, make in cases.items():
        times = sorted(per_token_us(make, ids, args.rounds))
        p99 = times[int(0.99 * (len(times) - 1))]
        print(f"{name}: median {statistics.median(times):.1f} us per token, p99 {p99:.1f} us")


if __name__ == "__main__":
    main()
