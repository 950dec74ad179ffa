"""Chinese written in pinyin, read as characters, and characters written for their sound, read
as the characters meant (`correct`), for the injection model (runtime.reading_form).

The model learned Chinese from characters. Dev's Chinese attacks written in toneless pinyin
(`hu lve zhi qian de suo you zhi ling`) were flagged 4 times in 85; with tone marks, 81 in 85,
but so were 110 of 175 benign rows (`python -m bench.pinyin`). So a stretch of Latin words that
spells pinyin is read as the characters it most likely stands for:

- a word is syllables (upper or lower case, tone marks or none, `ü` written `ü`, `v` or, in
  `lue` and `nue`, `u`), split with an apostrophe before a syllable that starts with a vowel, as
  pinyin's spelling has it (`xi'an`), or without one (`xiee`; the split with the fewest such
  syllables, then the fewest syllables, is taken);
- a stretch is three words or more, six syllables or more, between spaces or punctuation;
- its letters must read as pinyin, not as the pool's other text (English and 30 other
  languages): mean log-odds per letter of a letter-trigram model of each, at least ODDS;
- it is decoded by Viterbi search over the characters each syllable can be (a written tone that
  does not fit a character costs it TONE_MISS), scored by a character bigram model, and read as
  characters only when the decoding is likely Chinese (mean log-probability per character at
  least ACCEPT);
- a stretch of capitalized words (two thirds of them or more: `are Beijing, Tianjin, Shanghai`)
  is names, as English text writes them, and is read as written, unless the stretches that
  read as Chinese hold half the text's Latin letters or more; then those names are read too,
  and so are the text's shorter runs of pinyin words (digits and Latin words cut `chuang jian
  yi bu you 4 ge jue se` into runs).

The table `pinyin.tsv` holds, for the 4,771 characters that occur in the injection pool's
Chinese training text (train.jsonl and the extra rows, never dev), their readings (pypinyin
0.55.0's `pinyin_dict.json`, github.com/mozillazg/python-pinyin, MIT; license in
`pinyin.LICENSE`), their counts, the character bigrams seen twice or more in that text, and the
letter-trigram counts of that text in pinyin and of the pool's other text, and the syllables of
the other characters of the CJK blocks (for `correct`'s homophones). `python -m
classifiers.pinyin` rebuilds it (the wheel sha256-pinned, its data read, no code of it run); it
is checked against PINYIN_SHA256 when loaded.

Only what the injection model reads; the text that travels is left as it was.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import math
import re
import sys
import unicodedata
import zipfile
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

PINYIN_SHA256 = "0fb4be72b529ec41d7579849238328ffe4e2e70164d50b8df1349577305ffdad"
_PATH = Path(__file__).with_name("pinyin.tsv")

# Candidates per syllable (the most frequent characters that read so) and the cost of a
# character whose readings lack the tone written.
TOP = 16
TONE_MISS = -2.5
# Mean log-probability per character above which a decoding is read as Chinese (module doc).
ACCEPT = -7.5
# Mean log-odds per letter (pinyin against the pool's other text, letter trigrams) a stretch needs.
ODDS = 0.5
# Syllables decoded per text at most, half from its start, half from its end; the stretches
# between are read as written.
MAX_SYLLABLES = 4000
# Words per stretch at most; a longer run of pinyin words is cut into several stretches.
_WORDS = 300
_DISCOUNT = 0.75

_TONE_MARKS = {"\u0304": 1, "\u0301": 2, "\u030c": 3, "\u0300": 4}


def _base_table() -> tuple[dict[int, str], dict[int, int]]:
    """Lower-case ASCII for pinyin letters (ü as v, tone marks dropped), one character for one,
    and the tone each marked vowel carries."""
    base = {cp: chr(cp + 32) for cp in range(ord("A"), ord("Z") + 1)}
    tones: dict[int, int] = {}
    for vowel in "aeiouüAEIOUÜ":
        for mark, tone in _TONE_MARKS.items():
            composed = unicodedata.normalize("NFC", vowel + mark)
            if len(composed) == 1:
                base[ord(composed)] = "v" if vowel in "üÜ" else vowel.lower()
                tones[ord(composed)] = tone
    base[ord("ü")] = base[ord("Ü")] = "v"
    return base, tones


_BASE, _TONES = _base_table()


def split_tone(reading: str) -> tuple[str, int]:
    """A pypinyin reading (`lüè`) as its toneless syllable (`lve`) and tone (4; 0 for none)."""
    tone = max((_TONES.get(ord(c), 0) for c in reading), default=0)
    return reading.translate(_BASE), tone


@dataclass(frozen=True, slots=True)
class Model:
    """The decoder's tables: candidates per syllable, unigram and bigram log-probabilities."""

    candidates: dict[str, tuple[tuple[str, frozenset[int]], ...]]
    unigram: dict[str, float]  # log P(c)
    backoff: dict[str, float]  # log of the mass a character leaves to unseen followers
    bigram: dict[str, dict[str, float]]  # follower -> {predecessor: discounted P(b | a)}
    letters: dict[str, float]  # letter trigram -> log P(pinyin) - log P(other text), last letter
    unknown: float  # log P of a character the table does not hold
    homophones: dict[str, tuple[str, ...]]  # character -> the candidates of its syllables

    def pinyin_odds(self, letters: str) -> float:
        """Mean log-odds per letter that `letters` (a-z, no spaces) are pinyin, not other text."""
        grams = [letters[i : i + 3] for i in range(len(letters) - 2)]
        return sum(self.letters.get(g, 0.0) for g in grams) / max(1, len(grams))


@functools.cache
def model(path: Path = _PATH) -> Model:
    """The decoder's tables, read once and refused unless the file's sha256 matches."""
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != PINYIN_SHA256:
        raise RuntimeError(f"{path}: sha256 {digest}, expected {PINYIN_SHA256}")
    counts: dict[str, int] = {}
    left: dict[str, tuple[int, int]] = {}
    readings: dict[str, list[tuple[str, int]]] = {}
    rare: dict[str, set[str]] = {}  # characters the pool's text lacks -> their syllables
    pairs: dict[str, int] = {}
    trigrams: dict[str, Counter[str]] = {"p": Counter(), "o": Counter()}
    for line in raw.decode("utf-8").splitlines():
        if not line or line.startswith("#"):
            continue
        kind, *fields = line.split("\t")
        if kind == "c":
            char, count, total, followers, spoken = fields
            counts[char] = int(count)
            left[char] = (int(total), int(followers))
            readings[char] = [split_tone(r) for r in spoken.split(",")]
        elif kind == "b":
            pairs[fields[0]] = int(fields[1])
        elif kind == "r":
            rare[fields[0]] = {split_tone(r)[0] for r in fields[1].split(",")}
        else:
            trigrams[kind][fields[0]] = int(fields[1])
    n = sum(counts.values())
    unigram = {c: math.log((k + 0.5) / (n + 0.5 * len(counts))) for c, k in counts.items()}
    backoff = {c: math.log(_DISCOUNT * f / t) for c, (t, f) in left.items() if t}
    bigram: dict[str, dict[str, float]] = {}
    for ab, k in pairs.items():
        bigram.setdefault(ab[1], {})[ab[0]] = (k - _DISCOUNT) / left[ab[0]][0]
    by_syllable: dict[str, dict[str, set[int]]] = {}
    for char, spoken_list in readings.items():
        for syllable, tone in spoken_list:
            by_syllable.setdefault(syllable, {}).setdefault(char, set()).add(tone)
    candidates = {
        s: tuple((c, frozenset(t)) for c, t in sorted(chars.items(), key=lambda ct: -counts[ct[0]])[:TOP])
        for s, chars in by_syllable.items()
    }
    for spelled, syllable in (("lue", "lve"), ("nue", "nve")):
        if syllable in candidates:
            candidates[spelled] = candidates[syllable]
    # Homophones, the most frequent first, shared by the characters of one set of syllables (the
    # character itself may be among them: `correct` leaves it out).
    shared: dict[frozenset[str], tuple[str, ...]] = {}
    homophones: dict[str, tuple[str, ...]] = {}
    spoken_as = {c: frozenset(r for r, _ in rs) for c, rs in readings.items()}
    for c, syllables in (*spoken_as.items(), *((c, frozenset(s)) for c, s in rare.items())):
        if syllables not in shared:
            chars = {d for r in syllables if r in candidates for d, _ in candidates[r]}
            # Ties by character: a set's order changes with the process's hash seed, and every
            # worker must read a text alike.
            shared[syllables] = tuple(sorted(chars, key=lambda d: (-counts[d], d))[: HOMOPHONES + 1])
        homophones[c] = shared[syllables]
    unknown = math.log(0.5 / (n + 0.5 * len(counts)))
    return Model(
        candidates,
        unigram,
        backoff,
        bigram,
        _letter_odds(trigrams["p"], trigrams["o"]),
        unknown,
        homophones,
    )


def _letter_odds(pinyin: Counter[str], other: Counter[str]) -> dict[str, float]:
    """Per letter trigram, log P(last letter | first two) under pinyin minus under the other
    text (add-one smoothing over 26 letters)."""
    odds: dict[str, float] = {}
    contexts = {lang: Counter[str]() for lang in "po"}
    for lang, grams in (("p", pinyin), ("o", other)):
        for g, k in grams.items():
            contexts[lang][g[:2]] += k
    for g in pinyin.keys() | other.keys():
        p = (pinyin[g] + 1) / (contexts["p"][g[:2]] + 26)
        o = (other[g] + 1) / (contexts["o"][g[:2]] + 26)
        odds[g] = math.log(p / o)
    return odds


def _trie_pattern(words: Iterable[str]) -> str:
    """A regex alternation of `words` factored by prefix (one branch per first letter, not one
    per word), longest first where one word is a prefix of another."""
    trie: dict[str, dict] = {}  # type: ignore[type-arg]
    for w in words:
        node = trie
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def pattern(node: dict) -> str:  # type: ignore[type-arg]
        branches = [re.escape(ch) + pattern(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        group = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{group})?" if "" in node else group

    return pattern(trie)


# What may stand between two words of a stretch: spaces and punctuation, Chinese or Latin.
_GAP_CHARS = r'[ \t\r\n,.!?;:，。、！？；：“”‘’《》〈〉（）()【】\[\]「」『』"…—-]'
_INITIAL_VOWELS = frozenset("aeo")  # pinyin syllables that open with a vowel start a, e or o


@functools.cache
def _patterns() -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    """A pinyin word (syllables, an apostrophe between two of them or none); a stretch of three
    such words or more between spaces or punctuation; one of one word or more; over the base
    text."""
    syllable = _trie_pattern(model().candidates.keys())
    # Atomic: once a word has split into syllables, no other split of it is tried when what
    # follows fails (English text would otherwise backtrack through every split of every word).
    word = rf"(?>(?:{syllable})(?:'?(?:{syllable}))*(?![\w']))"
    gap = _GAP_CHARS + "++"
    stretch = rf"(?<![\w']){word}(?:{gap}{word}){{2,{_WORDS - 1}}}"
    short = rf"(?<![\w']){word}(?:{gap}{word}){{0,{_WORDS - 1}}}"
    return re.compile(word), re.compile(stretch), re.compile(short)


def prepare() -> None:
    """Read the table and compile the patterns now (at start-up), not on a first prompt."""
    _patterns()


def syllables(word: str) -> list[tuple[int, int]] | None:
    """The syllables a base-text word splits into, as (start, end) offsets, or None: the split
    with the fewest syllables that start with a vowel inside the word without an apostrophe
    (pinyin's spelling puts one there, `xi'an`, but writers leave it out, `xiee`), then the
    fewest syllables."""
    known = model().candidates
    n = len(word)
    best: list[tuple[int, int, list[tuple[int, int]]] | None] = [None] * (n + 1)
    best[0] = (0, 0, [])
    for i in range(n):
        here = best[i]
        if here is None:
            continue
        if word[i] == "'":
            if best[i + 1] is None or here[:2] < best[i + 1][:2]:  # type: ignore[index]
                best[i + 1] = here
            continue
        bare = 0 if i == 0 or word[i - 1] == "'" else 1
        for j in range(i + 1, min(n, i + 6) + 1):
            piece = word[i:j]
            if piece in known:
                cost = (here[0] + bare * (piece[0] in _INITIAL_VOWELS), here[1] + 1)
                there = best[j]
                if there is None or cost < there[:2]:
                    best[j] = (*cost, [*here[2], (i, j)])
    done = best[n]
    return done[2] if done else None


def viterbi(spoken: list[tuple[str, int]], m: Model) -> tuple[str, float]:
    """The likeliest characters for syllables `spoken` ((syllable, tone), tone 0 if unwritten),
    and their log-probability."""
    return best_path(
        [
            [(c, TONE_MISS if tone and tone not in t else 0.0) for c, t in m.candidates[syllable]]
            for syllable, tone in spoken
        ],
        m,
    )


def best_path(options: list[list[tuple[str, float]]], m: Model) -> tuple[str, float]:
    """The likeliest string with one character from each position's options ((character, cost
    added to its log-probability)), under the bigram model, and its log-probability."""
    floor = m.unknown
    scores: dict[str, float] = {}
    back: list[dict[str, str]] = []
    for here in options:
        if not scores:
            scores = {c: m.unigram.get(c, floor) + cost for c, cost in here}
            continue
        # Any predecessor reaches a character through the backoff; one seen before it in the
        # bigram table adds that bigram's mass (exact: the two are the interpolation's terms).
        opener = max(scores, key=lambda a: scores[a] + m.backoff.get(a, 0.0))
        o_score = scores[opener] + m.backoff.get(opener, 0.0)
        nxt: dict[str, float] = {}
        came: dict[str, str] = {}
        for c, cost in here:
            alone = m.unigram.get(c, floor)
            best, source = o_score + alone, opener
            seen_before = m.bigram.get(c)
            if seen_before:
                for a, s in scores.items():
                    seen = seen_before.get(a)
                    if seen is not None:
                        score = s + math.log(seen + math.exp(m.backoff.get(a, 0.0) + alone))
                        if score > best:
                            best, source = score, a
            nxt[c] = best + cost
            came[c] = source
        scores = nxt
        back.append(came)
    last = max(scores, key=lambda c: scores[c])
    chars = [last]
    for came in reversed(back):
        chars.append(came[chars[-1]])
    return "".join(reversed(chars)), scores[last]


_GAP = re.compile(_GAP_CHARS + "+")


@dataclass(slots=True)
class _Stretch:
    """A stretch of pinyin words: runs of syllables ((syllable, tone)), each run followed by
    the punctuation after it ("" for none)."""

    start: int
    end: int
    runs: list[tuple[list[tuple[str, int]], str]]

    @property
    def count(self) -> int:
        return sum(len(spoken) for spoken, _ in self.runs)


def _stretch(text: str, base: str, start: int, end: int, m: Model, *, least: int) -> _Stretch | None:
    """Base-text stretch [start, end) as syllables, or None unless it reads as pinyin by its
    letters (before any decoding: the cheap test first)."""
    if m.pinyin_odds(re.sub(r"[^a-z]", "", base[start:end])) < ODDS:
        return None
    word = _patterns()[0]
    runs: list[tuple[list[tuple[str, int]], str]] = []
    spoken: list[tuple[str, int]] = []
    pos = start
    while pos < end:
        gap = _GAP.match(base, pos, end)
        if gap:
            marks = text[gap.start() : gap.end()].strip()
            if marks and spoken:
                runs.append((spoken, marks))
                spoken = []
            pos = gap.end()
            continue
        w = word.match(base, pos, end)
        if w is None:  # the stretch pattern matched, so words and gaps tile it
            return None
        for i, j in syllables(w.group()) or ():
            tone = max((_TONES.get(ord(c), 0) for c in text[pos + i : pos + j]), default=0)
            spoken.append((w.group()[i:j], tone))
        pos = w.end()
    if spoken:
        runs.append((spoken, ""))
    found = _Stretch(start, end, runs)
    return found if found.count >= least else None


def _decoded(found: _Stretch, m: Model) -> str | None:
    """The characters the stretch spells (its punctuation kept), or None unless the decoding is
    likely Chinese (mean log-probability per character at least ACCEPT)."""
    pieces: list[str] = []
    total = 0.0
    for spoken, marks in found.runs:
        chars, score = viterbi(spoken, m)
        pieces += (chars, marks)
        total += score
    return "".join(pieces) if total / found.count >= ACCEPT else None


def _ends(n: int, budget: int, size: Callable[[int], int | None]) -> list[int]:
    """Which of `n` items to read: from the start and from the end, `budget` / 2 each way at
    most (as the classifier reads a long text's first windows and its last one). `size(i)` is
    asked once per item reached, None for one that is not read and costs nothing; the items
    between the two ends are never asked about."""
    sizes: dict[int, int | None] = {}
    chosen: set[int] = set()
    for order in (range(n), range(n - 1, -1, -1)):
        left = budget // 2
        for i in order:
            if i not in sizes:
                sizes[i] = size(i)
            cost = sizes[i]
            if cost is None:
                continue
            left -= cost
            if left < 0:
                break
            chosen.add(i)
    return sorted(chosen)


def _within_budget(
    found: Sequence[re.Match[str]], syllables: int, look: Callable[[re.Match[str]], _Stretch | None]
) -> list[_Stretch]:
    """The stretches to decode among the matches `found`, looked at (`look`) from the start and
    from the end within `syllables` (`_ends`)."""
    stretches: dict[int, _Stretch | None] = {}

    def size(i: int) -> int | None:
        stretch = stretches[i] = look(found[i])
        return None if stretch is None else stretch.count

    return [s for i in _ends(len(found), syllables, size) if (s := stretches[i]) is not None]


_WORD_CHARS = re.compile(r"[^\W\d_]+")
_CAPITALIZED = re.compile(r"[^\W\d_a-z][^\W\d_A-Z]")  # a capital, then a small letter


def _names(text: str, stretch: _Stretch) -> bool:
    """Whether two thirds of the stretch's words or more are capitalized (`are Beijing, Tianjin,
    Shanghai`, `Xiang Yu`): names, as English text writes them, not a sentence in pinyin."""
    words = _WORD_CHARS.findall(text, stretch.start, stretch.end)
    return 3 * sum(bool(_CAPITALIZED.match(w)) for w in words) >= 2 * len(words)


_MARKED = re.compile("[" + "".join(sorted(chr(cp) for cp in _TONES)) + "üÜ]")


def _base(text: str) -> str:
    """`text` with pinyin's letters as lower-case ASCII, one character for one (the cheap way
    where it has no tone marks)."""
    if text.isascii() or not _MARKED.search(text):
        lower = text.lower()
        if len(lower) == len(text):  # a few letters (İ) lower to two characters
            return lower
    return text.translate(_BASE)


def read(text: str) -> str:
    """`text` with every stretch of Chinese written in pinyin read as the characters it most
    likely spells (module doc); other text as it is.

    Where the stretches read as Chinese hold half the text's Latin letters or more, its
    stretches of capitalized words (`Beijing, Tianjin, Shanghai`: names, in English text) and
    its shorter runs of pinyin words (two syllables or more) are read too: digits and Latin
    words cut `chuang jian yi bu you 4 ge jue se` into runs. In English text that names a few
    people or places in pinyin, those names are read as written."""
    base = _base(text)
    found = list(_patterns()[1].finditer(base))
    if not found:
        return text
    m = model()
    stretches = _within_budget(
        found, MAX_SYLLABLES, lambda f: _stretch(text, base, f.start(), f.end(), m, least=6)
    )
    read_as = {s.start: (s, chars) for s in stretches if (chars := _decoded(s, m))}
    decoded = {k: v for k, v in read_as.items() if not _names(text, v[0])}
    if 2 * sum(_letters(base[s.start : s.end]) for s, _ in read_as.values()) >= _letters(base):
        decoded = read_as
        spent = sum(s.count for s, _ in decoded.values())
        _read_short(text, base, decoded, MAX_SYLLABLES - spent, m)
    if not decoded:
        return text
    out: list[str] = []
    pos = 0
    for start in sorted(decoded):
        stretch, chars = decoded[start]
        out += (text[pos:start], chars)
        pos = stretch.end
    out.append(text[pos:])
    return "".join(out)


def _letters(base: str) -> int:
    return sum(map(base.count, "abcdefghijklmnopqrstuvwxyz"))


def _read_short(
    text: str, base: str, decoded: dict[int, tuple[_Stretch, str]], budget: int, m: Model
) -> None:
    """Add to `decoded` the runs of fewer than three words or six syllables that read as Chinese."""
    # The same test on the same words gives the same verdict: only the syllable count differs,
    # so a run of the long pattern is looked at again unless it was read.
    starts = sorted(decoded)
    ends = [decoded[start][0].end for start in starts]

    def overlaps(f: re.Match[str]) -> bool:
        i = bisect.bisect_right(starts, f.start())
        return (i > 0 and ends[i - 1] > f.start()) or (i < len(starts) and starts[i] < f.end())

    found = [f for f in _patterns()[2].finditer(base) if not overlaps(f)]
    for s in _within_budget(found, budget, lambda f: _stretch(text, base, f.start(), f.end(), m, least=2)):
        if chars := _decoded(s, m):
            decoded[s.start] = (s, chars)


def _texts() -> tuple[list[str], list[str]]:
    """The pool's Chinese training text and its other text (English and the other languages),
    from train.jsonl and the extra rows; never dev."""
    from classifiers.injection.data import DATASETS, load
    from classifiers.scripts import HAN

    rows = load(DATASETS / "train.jsonl")
    texts = [r.text for r in rows if HAN.search(r.text)]
    other = [r.text for r in rows if not HAN.search(r.text)]
    extra = Path(__file__).parent / "injection" / "extra.jsonl"
    with extra.open(encoding="utf-8") as f:
        extras = [json.loads(line)["text"] for line in f]
    texts += [t for t in extras if HAN.search(t)]
    other += [t for t in extras if not HAN.search(t)]
    return texts, other


def _trigrams(counts: Counter[str], text: str) -> None:
    letters = re.sub(r"[^a-z]", "", text)
    counts.update(letters[i : i + 3] for i in range(len(letters) - 2))


def build(cache: Path, texts: list[str], other: list[str]) -> bytes:
    """pinyin.tsv's bytes: readings from the pinned pypinyin wheel, counts from `texts`."""
    from classifiers.injection.extra import Package, fetch

    pkg = Package(
        "pypinyin",
        "0.55.0",
        "d53b1e8ad2cdb815fb2cb604ed3123372f5a28c6f447571244aca36fc62a286f",
        "MIT",
        "mozillazg/python-pinyin",
    )
    with zipfile.ZipFile(fetch(pkg, cache)) as z:
        spoken: dict[str, str] = json.loads(z.read("pypinyin/pinyin_dict.json"))
    counts: Counter[str] = Counter()
    pairs: Counter[str] = Counter()
    for text in texts:
        for run in re.findall(r"[\u4e00-\u9fff]+", text):
            counts.update(run)
            pairs.update(run[i : i + 2] for i in range(len(run) - 1))
    total: Counter[str] = Counter()
    followers: Counter[str] = Counter()
    for ab, k in pairs.items():
        total[ab[0]] += k
        followers[ab[0]] += 1
    dropped = {"m", "n", "ng", "hm", "hng"}  # interjections (嗯, 哼, 呣), not syllables words are spelled in
    lines = [
        "# Pinyin -> characters for the injection model's reading form (classifiers/pinyin.py).",
        "# c: character, count, bigram count as first of two, distinct followers, readings",
        "# (pypinyin 0.55.0 pinyin_dict.json, github.com/mozillazg/python-pinyin, MIT: pinyin.LICENSE);",
        "# r: a character the pool's text lacks, its toneless syllables (for homophones: pinyin.correct).",
        "# b: a character bigram seen twice or more, count. Counts: the injection pool's Chinese",
        "# training text (train.jsonl, extra.jsonl). p, o: letter trigram counts of that text in pinyin",
        "# (each character's first reading) and of the pool's other training text (English, other languages).",
        "# Rebuilt by `python -m classifiers.pinyin`.",
    ]
    for cp, readings in sorted(spoken.items(), key=lambda kv: int(kv[0])):
        char = chr(int(cp))
        kept = [r for r in readings.split(",") if split_tone(r)[0] not in dropped]
        if char in counts and kept:
            lines.append(f"c\t{char}\t{counts[char]}\t{total[char]}\t{followers[char]}\t{','.join(kept)}")
        elif kept and _HAN_RUN.fullmatch(char * 2):
            lines.append(f"r\t{char}\t{','.join(sorted({split_tone(r)[0] for r in kept}))}")
    letters: dict[str, Counter[str]] = {"p": Counter(), "o": Counter()}
    for text in texts:
        first = (spoken.get(str(ord(c)), "").split(",")[0] for c in text if "\u4e00" <= c <= "\u9fff")
        _trigrams(letters["p"], "".join(split_tone(r)[0] for r in first))
    for text in other:
        _trigrams(letters["o"], text.translate(_BASE))
    known = {line.split("\t")[1] for line in lines if line.startswith("c\t")}
    for ab, k in sorted(pairs.items()):
        if k >= 2 and ab[0] in known and ab[1] in known:
            lines.append(f"b\t{ab}\t{k}")
    for lang in "po":
        lines += (f"{lang}\t{g}\t{k}" for g, k in sorted(letters[lang].items()))
    return ("\n".join(lines) + "\n").encode("utf-8")


# Chinese characters in a row, and the cost of reading a character as one of its homophones.
_HAN_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]{2,}")
SWAP = -8.0
# Homophones tried per character at most (the most frequent), and characters looked at per text.
HOMOPHONES = 12
MAX_CORRECTED = 20000


def _others(m: Model, c: str) -> list[str]:
    """The homophones `c` may be read as."""
    return [h for h in m.homophones.get(c, ()) if h != c][:HOMOPHONES]


def _fitting(m: Model, run: str, odd: list[bool], k: int) -> list[str]:
    """The homophones of `run[k]` that make a pair the table holds with a neighbour as written,
    or all of them where both neighbours may change too (the search stays small)."""
    left = run[k - 1] if k > 0 else None
    right = run[k + 1] if k + 1 < len(run) else None
    if (left is None or odd[k - 1]) and (right is None or odd[k + 1]):
        return _others(m, run[k])
    return [
        h
        for h in _others(m, run[k])
        if (left is not None and left in m.bigram.get(h, ()))
        or (right is not None and h in m.bigram.get(right, ()))
    ]


def _likeliest(m: Model, a: str, c: str, b: str) -> str:
    """`c`, or the homophone of it that is likeliest between `a` and `b` (SWAP counted)."""

    def score(x: str) -> float:
        return _step(m, a, x) + _step(m, x, b)

    best, top = c, score(c)
    for h in _others(m, c):
        if (value := score(h) + SWAP) > top:
            best, top = h, value
    return best


def _step(m: Model, a: str, b: str) -> float:
    """log P(b | a) under the bigram model (absolute discounting, the unigram beneath)."""
    alone = m.unigram.get(b, m.unknown)
    return math.log(m.bigram.get(b, {}).get(a, 0.0) + math.exp(m.backoff.get(a, 0.0) + alone))


def correct(text: str) -> str:
    """`text` with characters written for their sound read as the characters meant: 谐音, the
    homophone substitution that hides an instruction from a filter (`忽掠以上所有指另` for
    `忽略以上所有指令`), and that a model reads past.

    A character that makes no pair the bigram table holds with either neighbour may be read as
    a homophone (one of the HOMOPHONES most frequent characters that share a toneless syllable
    with it and make a known pair with a neighbour as written, unless both neighbours may
    change too), at a cost of SWAP in log-probability; the likeliest reading of each stretch of
    such characters, between its fixed neighbours, under the bigram model, is taken. Ordinary
    text keeps nearly every character (dev's Chinese rows: 0.2% changed). Of a long text, the
    runs of its first and its last MAX_CORRECTED / 2 characters are looked at (as the classifier
    reads a long text's first windows and its last one)."""
    runs = list(_HAN_RUN.finditer(text))
    if not runs:
        return text
    m = model()
    out: list[str] = []
    pos = 0
    for i in _ends(len(runs), MAX_CORRECTED, lambda i: len(runs[i].group())):
        out += (text[pos : runs[i].start()], _fixed(runs[i].group(), m))
        pos = runs[i].end()
    out.append(text[pos:])
    return "".join(out)


def _fixed(run: str, m: Model) -> str:
    """A run of Chinese characters with its homophones read as the characters meant (`correct`)."""
    n = len(run)
    # A character written for its sound rarely makes a pair the table holds with either
    # neighbour: those whose pairs on both sides are unseen (the one pair at a run's ends).
    unseen = [run[i] not in m.bigram.get(run[i + 1], ()) for i in range(n - 1)]
    odd = [(i == 0 or unseen[i - 1]) and (i == n - 1 or unseen[i]) for i in range(n)]
    if not any(odd):
        return run
    out = list(run)
    i = 0
    while i < n:
        if not odd[i]:
            i += 1
            continue
        j = i
        while j < n and odd[j]:
            j += 1
        if j == i + 1 and 0 < i < n - 1:  # one character between two fixed ones: no search
            out[i] = _likeliest(m, out[i - 1], run[i], run[i + 1])
            i = j
            continue
        # Positions i..j-1 may change; the fixed characters either side give their context.
        lo, hi = max(0, i - 1), min(n, j + 1)
        options = [
            [(c, 0.0)] + ([(h, SWAP) for h in _fitting(m, run, odd, k)] if odd[k] else [])
            for k, c in enumerate(run[lo:hi], start=lo)
        ]
        out[lo:hi] = best_path(options, m)[0]
        i = j
    return "".join(out)


if __name__ == "__main__":
    data = build(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".cache/pinyin"), *_texts())
    _PATH.write_bytes(data)
    chars, pairs = data.count(b"\nc\t"), data.count(b"\nb\t")
    print(f"{_PATH}: {chars} characters, {pairs} bigrams, sha256 {hashlib.sha256(data).hexdigest()}")
