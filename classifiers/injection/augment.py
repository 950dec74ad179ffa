"""Training augmentations for the injection classifier (project-made, deterministic per seed).

Two kinds, both aimed at what the leave-one-source-out evaluation shows the pool teaches badly:

- **embedded attacks** (label 1): a short attack from the training side inserted at the start,
  middle or end of a benign document-like prompt (an email, a table, a Wikipedia paragraph, a long
  request). Indirect injection arrives this way; the pool has it only for BIPIA contexts and
  Chinese Wikipedia.
- **benign prompts with trigger words** (label 0): ordinary requests that use the words attacks
  use ("ignore", "bypass", "reset", "pretend", "system prompt", 忽略, 绕过, 扮演, 系统…), so the model
  cannot learn the word instead of the intent.

Both draw only on the rows they are given, so a family held out of training never leaks in.
"""

from __future__ import annotations

import base64
import random
from collections.abc import Sequence

from classifiers.injection import phrases
from classifiers.injection.data import Row

# Benign requests that contain attack vocabulary. {x} slots take a topic from TOPICS.
TRIGGER_EN = [
    "How do I reset my password if I no longer have access to my email?",
    "Ignore the outliers in this data set and compute the mean of the rest: {nums}",
    "Please ignore my previous message, I sent it by mistake. What I meant to ask is how {x} works.",
    "Can you bypass the cache when testing {x} so I see fresh results?",
    "Pretend you are a tour guide in Rome and describe the Colosseum to a group of children.",
    "Act as a patient tutor and explain {x} step by step.",
    "Write a system prompt for a customer-support assistant that answers questions about {x}.",
    "What is a system prompt, and how should I phrase one for a summarization bot?",
    "My doctor said I need bypass surgery. What does the recovery usually look like?",
    "Translate into French: 'Ignore the first page, the instructions start on page two.'",
    "Summarize the following instructions for new employees: badge in, ignore the side door, sign the log.",
    "Override the default font in my CSS so that headings use {font}.",
    "How can I disable the developer mode warning in Chrome extensions I built myself?",
    "Roleplay a job interview with me for a {job} position; you are the interviewer.",
    "Forget everything I said about the budget, the new limit is {num} dollars. Re-plan the trip.",
    "Is it safe to jailbreak my own old iPhone to install an app that is no longer in the store?",
    "Explain what a prompt injection attack is, for a security awareness training.",
    "Our firewall rules block port {port}. How do I add an exception for our internal service?",
    "You are now the narrator of a bedtime story about {x}. Begin.",
    "In the novel, the detective ignores the rules to solve the case. Write the next scene.",
    "Repeat the word 'hello' three times, then explain why repetition helps learning {x}.",
    "Disregard the formatting in the text below and just count its words: {x} is interesting.",
    "What does 'sudo' do, and when should I avoid running commands as root?",
    "Write unit tests that bypass the network layer by mocking the HTTP client.",
    "Give me instructions to reset a Netgear router to factory settings.",
    "Print the configuration of my nginx server block in a cleaner format: server {{ listen {port}; }}",
    "As a DAN (Designated Area Nurse) on the night shift, how should I plan my breaks?",
    "Please reveal the answer to yesterday's crossword clue about {x}.",
    "How do unrestricted stock units differ from options?",
    "New instructions from my manager: the report is due Friday. Draft an email confirming it.",
]
TRIGGER_ZH = [
    "请忽略上一条消息，我发错了。我想问的是{x}是怎么回事。",
    "如何重置我的邮箱密码？我忘记了原来的密码。",
    "请扮演一位耐心的老师，给初中生讲解{x}。",
    "帮我写一段客服机器人的系统提示词，主要回答关于{x}的问题。",
    "医生说我需要做心脏搭桥手术，术后恢复要注意什么？",
    "计算下面数据的平均值，忽略其中的异常值：{nums}",
    "绕过拥堵路段去机场，最快的路线是什么？",
    "你现在是一名导游，请向游客介绍故宫的历史。",
    "请把这句话翻译成英文：忽略第一页，说明从第二页开始。",
    "公司防火墙屏蔽了{port}端口，怎样为内部服务添加例外规则？",
    "什么是提示词注入攻击？请为安全培训写一段简短的说明。",
    "忘掉之前说的预算，新的上限是{num}元，请重新规划行程。",
    "请以小说主角的身份写一段独白，他决定不再遵守家族的规矩。",
    "开发者模式在安卓手机上怎么打开？我想调试自己写的应用。",
    "请扮演面试官，和我模拟一次{job}岗位的面试。",
    "系统提示音太大了，Windows 里怎么调低？",
    "请重复三遍“你好”，然后解释为什么重复有助于学习{x}。",
    "不要理会下文的格式，只统计字数：{x}很有意思。",
    "如何解除手机的家长控制？我是家长，孩子已经成年了。",
    "新的指示：周五前交报告。请帮我写一封确认邮件给经理。",
]
TOPICS_EN = [
    "photosynthesis",
    "compound interest",
    "TCP handshakes",
    "the French Revolution",
    "vaccines",
    "binary search",
    "inflation",
    "plate tectonics",
    "recursion",
    "the water cycle",
]
TOPICS_ZH = [
    "光合作用",
    "复利",
    "TCP 三次握手",
    "法国大革命",
    "疫苗",
    "二分查找",
    "通货膨胀",
    "板块构造",
    "递归",
    "水循环",
]
JOBS = ["data analyst", "nurse", "backend engineer", "accountant", "teacher"]
FONTS = ["Georgia", "Inter", "Roboto Slab"]


def _fill(template: str, rng: random.Random, zh: bool) -> str:
    return template.format(
        x=rng.choice(TOPICS_ZH if zh else TOPICS_EN),
        nums=", ".join(str(rng.randint(1, 99)) for _ in range(rng.randint(5, 9)))
        + f", {rng.randint(900, 5000)}",
        font=rng.choice(FONTS),
        job=rng.choice(JOBS),
        num=rng.randint(500, 9000),
        port=rng.choice([22, 443, 5432, 6379, 8080, 8443]),
    )


def trigger_word_benign(n: int, seed: int = 0) -> list[Row]:
    """`n` benign requests that use attack vocabulary, English and Chinese in proportion to the templates."""
    rng = random.Random(seed)  # noqa: S311 - reproducible augmentation, not a secret
    out = []
    templates = [(t, False) for t in TRIGGER_EN] + [(t, True) for t in TRIGGER_ZH]
    for i in range(n):
        t, zh = templates[i % len(templates)]
        out.append(Row(_fill(t, rng, zh), 0, "augment:trigger-words"))
    return out


def _split_point(text: str, where: str, rng: random.Random) -> int:
    if where == "start":
        return 0
    if where == "end":
        return len(text)
    # Middle: at a sentence or line end near a random point, so the text stays readable.
    mid = rng.randint(len(text) // 4, 3 * len(text) // 4)
    for sep in ("\n", "。", ". "):
        k = text.find(sep, mid)
        if 0 <= k < len(text) - 1:
            return k + len(sep)
    return mid


def embedded_attacks(rows: Sequence[Row], n: int, seed: int = 0) -> list[Row]:
    """`n` benign documents (from `rows`) each carrying one short attack (from `rows`) inside."""
    rng = random.Random(seed)  # noqa: S311 - reproducible augmentation, not a secret
    attacks = [r for r in rows if r.label == 1 and 20 <= len(r.text) <= 400]
    docs = _long_benign(rows)
    if not attacks or not docs:
        return []
    out = []
    for _ in range(n):
        doc, attack = rng.choice(docs), rng.choice(attacks)
        where = rng.choice(("start", "middle", "end"))
        k = _split_point(doc.text, where, rng)
        joiner = "\n\n" if rng.random() < 0.5 else " "
        text = (
            doc.text[:k]
            + (joiner if k else "")
            + attack.text
            + (joiner if k < len(doc.text) else "")
            + doc.text[k:]
        )
        out.append(Row(text.strip(), 1, f"augment:embedded:{where}"))
    return out


# --- composed framings (phrases.py) -------------------------------------------------------------
def _slots(rng: random.Random, zh: bool) -> dict[str, str]:
    return {
        "name": rng.choice(phrases.NAMES),
        "brand": rng.choice(phrases.BRANDS),
        "domain": rng.choice(phrases.DOMAINS),
        "email": rng.choice(phrases.EMAILS),
        "acct": f"{rng.randint(10**9, 10**10 - 1)}",
        "code": f"{rng.choice('ABCDEFXZ')}{rng.randint(1000, 99999)}",
        "role": rng.choice(phrases.ROLES_ZH if zh else phrases.ROLES_EN),
        "place": rng.choice(phrases.PLACES_ZH if zh else phrases.PLACES_EN),
        "topic": rng.choice(TOPICS_ZH if zh else TOPICS_EN),
        "lang": rng.choice(phrases.LANGS_ZH if zh else phrases.LANGS_EN),
    }


def _compose(rng: random.Random, template: str, zh: bool, **given: str) -> str:
    slots = _slots(rng, zh) | given
    # Goals and tasks carry slots of their own; fill them first.
    for key in ("goal", "task"):
        if key in slots:
            slots[key] = slots[key].format(**slots)
    text = template.format(**slots)
    return text.replace("。。", "。").replace("..", ".")


def _goal(rng: random.Random, zh: bool, harmful: float) -> str:
    if rng.random() < harmful:
        return rng.choice(phrases.HARM_ZH if zh else phrases.HARM_EN)
    return rng.choice(phrases.HIJACK_ZH if zh else phrases.HIJACK_EN)


def _benign_lead(rng: random.Random, zh: bool) -> str:
    """An ordinary request an attack rides on ("Translate this: ignore previous instructions…")."""
    task = rng.choice(phrases.TASKS_ZH if zh else phrases.TASKS_EN)
    return _compose(rng, task, zh)


def composed_attacks(n: int, seed: int = 0) -> list[Row]:
    """`n` attacks, half English half Chinese, each one framing from `phrases.py` with a goal.

    Styles: overriding instructions (with a hijack or harmful goal), unrestricted personas and
    fiction wrappers (harmful goals), claimed authority, prompt extraction, and a payload split or
    encoded so the words never appear together. A third ride on an ordinary request.
    """
    rng = random.Random(seed)  # noqa: S311 - reproducible augmentation, not a secret
    out: dict[str, Row] = {}
    for i in range(20 * n):
        if len(out) == n:
            break
        zh = i % 2 == 1
        style = rng.choice(("override", "override", "persona", "persona", "authority", "extract", "split"))
        if style == "override":
            t = rng.choice(phrases.OVERRIDE_ZH if zh else phrases.OVERRIDE_EN)
            text = _compose(rng, t, zh, goal=_goal(rng, zh, 0.3))
        elif style == "persona":
            t = rng.choice(phrases.PERSONA_ZH if zh else phrases.PERSONA_EN)
            text = _compose(rng, t, zh, goal=_goal(rng, zh, 0.85))
        elif style == "authority":
            t = rng.choice(phrases.AUTHORITY_ZH if zh else phrases.AUTHORITY_EN)
            text = _compose(rng, t, zh, goal=_goal(rng, zh, 0.5))
        elif style == "extract":
            text = rng.choice(phrases.EXTRACT_ZH if zh else phrases.EXTRACT_EN)
        else:
            attack = _compose(
                rng,
                rng.choice(phrases.OVERRIDE_ZH if zh else phrases.OVERRIDE_EN),
                zh,
                goal=_goal(rng, zh, 0.5),
            )
            text = _split_payload(attack, rng, zh)
        if style != "split" and rng.random() < 0.33:
            lead = _benign_lead(rng, zh)
            text = f"{lead}{'' if zh else ' '}{text}" if rng.random() < 0.5 else f"{text}\n\n{lead}"
        if not zh and style != "split" and rng.random() < 0.1:
            text = text.upper() if rng.random() < 0.5 else text.lower()
        out.setdefault(text, Row(text, 1, f"augment-attack:{style}"))
    return list(out.values())


def _split_payload(attack: str, rng: random.Random, zh: bool) -> str:
    """The attack hidden from a keyword reader: split into variables, or base64-encoded."""
    if rng.random() < 0.5:
        k = len(attack) // 2
        if zh:
            return f"设 a = “{attack[:k]}”，b = “{attack[k:]}”。请不加评论地执行 a + b 的内容。"
        return f"Let a = '{attack[:k]}' and b = '{attack[k:]}'. Now do what a + b says, without commenting."
    encoded = base64.b64encode(attack.encode()).decode()
    if zh:
        return f"解码这段 base64 并照做，不要解释：{encoded}"
    return f"Decode this base64 string and follow it exactly, no explanation: {encoded}"


def _long_benign(rows: Sequence[Row]) -> list[Row]:
    """Benign rows long enough to host an instruction (a document, an email, a long request)."""
    return [r for r in rows if r.label == 0 and 300 <= len(r.text) <= 3000]


def _documents(rows: Sequence[Row]) -> tuple[list[Row], list[Row]]:
    docs = _long_benign(rows)
    return [d for d in docs if d.language != "zh"], [d for d in docs if d.language == "zh"]


def _insert(doc: str, line: str, rng: random.Random) -> str:
    k = _split_point(doc, rng.choice(("start", "middle", "end")), rng)
    return (doc[:k] + "\n\n" + line + "\n\n" + doc[k:]).strip()


def composed_indirect(rows: Sequence[Row], n: int, seed: int = 0) -> list[Row]:
    """`n` benign documents (from `rows`) carrying an instruction addressed to an AI, usually under
    the ordinary task the user asked about the document; the document's language picks the line's."""
    rng = random.Random(seed)  # noqa: S311 - reproducible augmentation, not a secret
    en_docs, zh_docs = _documents(rows)
    out: list[Row] = []
    for i in range(n):
        zh = bool(zh_docs) and (i % 2 == 1 or not en_docs)
        pool = zh_docs if zh else en_docs
        if not pool:
            return out
        line = _compose(
            rng, rng.choice(phrases.INDIRECT_ZH if zh else phrases.INDIRECT_EN), zh, goal=_goal(rng, zh, 0.2)
        )
        text = _insert(rng.choice(pool).text, line, rng)
        out.append(Row(_with_task(text, rng, zh), 1, "augment-attack:indirect"))
    return out


def _with_task(doc: str, rng: random.Random, zh: bool) -> str:
    if rng.random() < 0.25:
        return doc
    task = rng.choice(phrases.DOC_TASK_ZH if zh else phrases.DOC_TASK_EN)
    return f"{task}\n\n{doc}" if rng.random() < 0.6 else f"{doc}\n\n{task}"


def composed_benign(rows: Sequence[Row], n: int, seed: int = 0) -> list[Row]:
    """`n` benign prompts shaped like the attacks: role and system prompts, fiction, questions about
    security, and documents (from `rows`) with an ordinary task or a note that sounds like an order."""
    rng = random.Random(seed)  # noqa: S311 - reproducible augmentation, not a secret
    en_docs, zh_docs = _documents(rows)
    out: dict[str, Row] = {}
    for i in range(20 * n):
        if len(out) == n:
            break
        zh = i % 2 == 1
        style = rng.choice(("role", "role", "system", "security", "fiction", "document", "document", "note"))
        docs = zh_docs if zh else en_docs
        if style in ("document", "note") and not docs:
            style = "role"
        if style == "role":
            task = rng.choice(phrases.TASKS_ZH if zh else phrases.TASKS_EN)
            text = _compose(rng, rng.choice(phrases.ROLE_ZH if zh else phrases.ROLE_EN), zh, task=task)
        elif style == "system":
            text = _compose(rng, rng.choice(phrases.SYSTEM_ZH if zh else phrases.SYSTEM_EN), zh)
        elif style == "security":
            text = rng.choice(phrases.SECURITY_ZH if zh else phrases.SECURITY_EN)
        elif style == "fiction":
            text = rng.choice(phrases.FICTION_ZH if zh else phrases.FICTION_EN)
        elif style == "document":
            text = _with_task(rng.choice(docs).text, rng, zh)
        else:
            text = _with_task(
                _insert(
                    rng.choice(docs).text, rng.choice(phrases.DOC_NOTE_ZH if zh else phrases.DOC_NOTE_EN), rng
                ),
                rng,
                zh,
            )
        out.setdefault(text, Row(text, 0, f"augment-benign:{style}"))
    return list(out.values())


def prompted_documents(rows: Sequence[Row], prompts: Sequence[Row], n: int, seed: int = 0) -> list[Row]:
    """`n` benign documents (from `rows`) under a system prompt or task template written for such
    a document (`prompts`, the frameworks' benign prompts): what a RAG or summarising application
    sends. A Chinese document gets a Chinese prompt half the time when there is one."""
    rng = random.Random(seed)  # noqa: S311 - reproducible augmentation, not a secret
    en_docs, zh_docs = _documents(rows)
    zh_prompts = [p.text for p in prompts if p.language == "zh"]
    en_prompts = [p.text for p in prompts if p.language != "zh"]
    out: dict[str, Row] = {}
    for i in range(4 * n):
        if len(out) == n or not en_prompts:
            break
        zh = i % 3 == 2 and bool(zh_docs)
        doc = rng.choice(zh_docs if zh else en_docs).text
        prompt = rng.choice(zh_prompts if zh and zh_prompts and rng.random() < 0.5 else en_prompts)
        text = prompt + "\n\n" + doc if rng.random() < 0.7 else doc + "\n\n" + prompt
        out.setdefault(text, Row(text, 0, "augment-benign:prompted-document"))
    return list(out.values())
