"""The ordered rung of the quote matcher on adversarial pages: the bounded regex it replaced
against the linear scan it uses now (`core.text_match.words_in_order`).

The page is N characters of "that " and the quote "that that that that zzzz": the first four
words occur everywhere, the last nowhere, which is the regex's worst case (it backtracks through
every gap of every word). Prints seconds per call and whether both answered the same. The regex
is only run up to --regex-max characters (it takes seconds at 10,000).

Usage: .venv/bin/python bench/quote_matcher.py [--sizes 1000,2000,4000,10000,40000,1000000] [--regex-max 4000]
"""

from __future__ import annotations

import argparse
import re
import time

from core.text_match import QuoteMatcher, normalize_text, ordered_words, words_in_order

QUOTE = "that that that that zzzz"


def regex_rung(page: str, words: list[str], gap: int) -> bool:
    """The previous implementation: one regex with bounded lazy gaps."""
    return re.search((r".{0,%d}?" % gap).join(re.escape(word) for word in words), page) is not None


def seconds(call) -> tuple[float, object]:
    start = time.perf_counter()
    answer = call()
    return time.perf_counter() - start, answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,2000,4000,10000,40000,1000000")
    parser.add_argument("--regex-max", type=int, default=4000, help="largest page the regex is run on")
    args = parser.parse_args()
    normalized = normalize_text(QUOTE)
    words, gap = ordered_words(normalized), max(80, 2 * len(normalized))
    print(f"{'chars':>9} {'regex s':>9} {'linear s':>9} {'match() s':>10}  same")
    for size in (int(s) for s in args.sizes.split(",")):
        page = ("that " * (size // 5 + 1))[:size]
        matcher = QuoteMatcher(page)
        _ = matcher._normalized  # normalize the page once, outside the timings
        linear_s, linear = seconds(lambda: words_in_order(matcher._normalized, words, gap))
        match_s, _ = seconds(lambda: matcher.match(QUOTE))
        if size <= args.regex_max:
            regex_s, regex = seconds(lambda: regex_rung(matcher._normalized, words, gap))
            print(f"{size:>9} {regex_s:>9.3f} {linear_s:>9.4f} {match_s:>10.4f}  {regex == linear}")
        else:
            print(f"{size:>9} {'-':>9} {linear_s:>9.4f} {match_s:>10.4f}  -")


if __name__ == "__main__":
    main()
