"""Answer scoring for training rewards and evaluation: exact integer match, or math-verify with our own timeout.

Two scorers, picked by name (``TrainConfig.reward``, ``BenchmarkConfig.scorer``):

``numeric`` (the synthetic arithmetic task). The completion ends its worked steps with a line ``Answer: <integer>``.
    extracted = the integer after the LAST ``Answer:``; format_ok = some line starts with ``Answer:``;
    correct = same integer as the gold (compared as canonical digit strings, so a megabyte of digits is fine and
    ``Answer: 041`` equals ``41``). A gold that is not an integer string is ungradable. Regexes are linear, so
    this runs in-process with no timeout.

``math_verify`` (competition maths). Rules, in order:
    1. gold: the data README's answer (bare LaTeX) is wrapped as ``$answer$`` and parsed with math-verify's LaTeX
       extractor; if that yields nothing, ``\\boxed{answer}`` is tried. ``normalize_answer`` runs first, on golds
       and boxed answers alike: a trailing ``%``/``\\%`` is dropped (math-verify reads ``62.5%`` and ``62.5\\%``
       inconsistently, and a ``%`` inside a box is a LaTeX comment), and Python-style ``4.5e33`` becomes
       ``4.5 \\times 10^{33}`` (math-verify would read ``e`` as Euler's number; Minerva solutions write it so).
       A gold that still parses to nothing is ungradable (``gradable=False``): counted, never scored as wrong.
    2. prediction: the content of the LAST complete ``\\boxed{...}`` (our brace-matching scan; an earlier box
       the model corrected does not count) is parsed by math-verify. If there is no box, or it does not parse,
       math-verify reads the whole completion with its own priorities: boxed first (``boxed_match_priority=0``),
       then other LaTeX environments (``$..$``, ``\\[..\\]``, "final answer is ..."), then plain expressions.
       math-verify's default normalisation (units stripped, ``\\frac14``-style shorthand repaired).
       format_ok = the completion holds a complete ``\\boxed{...}`` (balanced braces), found by a linear scan.
       extracted = the last box's normalised LaTeX; for the fallback, the parsed value as sympy prints it
       (math-verify does not report which span it read); None when nothing was read. maj@k groups these strings.
    3. correct = ``verify(gold, pred)`` in that order (math-verify is not symmetric), default precision.

math-verify's own timeouts use SIGALRM, which fails off the main thread, so they are disabled
(``parsing_timeout=None``, ``timeout_seconds=None``) and ours is enforced instead: scoring runs in ONE long-lived
worker subprocess per calling process, or a pool of ``workers`` of them scoring a batch's items side by side
(``python -m harness.data.scoring``, stdin/stdout pipes, length-prefixed pickles); the parent waits for each item's
answer up to ``timeout_s``. When the deadline passes the worker is killed, the item is scored incorrect with
``timed_out=True``, and a fresh worker (about 1 s to import sympy) takes its place. The clock covers the item only:
waiting for a worker to finish starting is extra.
This works from threads, from daemonic worker processes (a plain subprocess, not ``multiprocessing``) and does
not depend on ``__main__`` being importable. Calls from several threads share the worker under a lock; a forked
child starts its own. Recent math-verify results are memoised by (gold, timeout, digest of the completion), so
scoring the same completions again (lm-eval's process_results, then the per-sample file) costs nothing.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import pickle
import re
import select
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from harness.config.choices import SCORERS
from harness.config.paths import REPO_ROOT

WORKER_START_TIMEOUT_S = 120.0  # importing sympy + antlr on a loaded 2-core box can take a while


@dataclass(frozen=True)
class Score:
    correct: bool
    extracted: str | None  # the answer text the scorer compared; None when nothing was found
    format_ok: bool  # numeric: an ``Answer:`` line exists; math_verify: a complete \boxed{} exists
    gradable: bool  # False when the gold itself cannot be read; never counted as wrong
    timed_out: bool  # scoring hit the deadline; the item counts as incorrect


# --- numeric ------------------------------------------------------------------------------------------------------

_ANSWER_LINE = re.compile(r"^[ \t]*Answer:", re.MULTILINE)
_ANSWER_NUMBER = re.compile(r"Answer:[ \t]*([+-]?[0-9]+)")
_INTEGER = re.compile(r"[+-]?[0-9]+")


def _canonical_int(text: str) -> str:
    """'+041' -> '41', '-0' -> '0'; string-based because int() refuses more than 4300 digits."""
    sign = "-" if text.startswith("-") else ""
    digits = text.lstrip("+-").lstrip("0") or "0"
    return digits if digits == "0" else sign + digits


def score_numeric(completion: str, gold: str) -> Score:
    """Exact integer match of the last ``Answer: <integer>`` against an integer gold."""
    gold = gold.strip()
    gradable = _INTEGER.fullmatch(gold) is not None
    format_ok = _ANSWER_LINE.search(completion) is not None
    numbers = _ANSWER_NUMBER.findall(completion)
    extracted = _canonical_int(numbers[-1]) if numbers else None
    correct = gradable and extracted is not None and extracted == _canonical_int(gold)
    return Score(correct=correct, extracted=extracted, format_ok=format_ok, gradable=gradable, timed_out=False)


# --- math-verify (runs inside the worker) -------------------------------------------------------------------------

_BOX_TOKENS = re.compile(r"\\boxed\s*\{|\{|\}")
_TRAILING_PERCENT = re.compile(r"\s*\\?%\s*$")
_PYTHON_SCI = re.compile(r"(?<![\w.\\])(\d+(?:\.\d+)?)[eE]([+-]?\d+)(?![\w.])")  # 3.83e35; "2e", "e5", "a1e5" stay


def normalize_answer(text: str) -> str:
    """Rewrites applied to golds and to the boxed answer alike: drop a trailing ``%``/``\\%``, and turn
    Python-style ``3.83e35`` into ``3.83 \\times 10^{35}`` (math-verify reads that ``e`` as Euler's number)."""
    text = _TRAILING_PERCENT.sub("", text.strip())
    return _PYTHON_SCI.sub(r"\1 \\times 10^{\2}", text)


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (balanced braces), in one linear pass; None if there is none."""
    stack: list[tuple[bool, int]] = []  # (opened by \boxed, content start)
    best: tuple[int, int] | None = None
    for match in _BOX_TOKENS.finditer(text):
        token = match.group()
        if token == "}":
            if stack:
                boxed, start = stack.pop()
                if boxed:
                    best = (start, match.start())
        else:
            stack.append((token != "{", match.end()))
    return None if best is None else text[best[0]:best[1]]


_MV = {}  # lazily built math-verify configs (imports are slow; the parent process never needs them)


def _mv():
    if not _MV:
        import logging

        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

        logging.getLogger("math_verify").setLevel(logging.ERROR)  # the "timeout is disabled" warning, per call
        # math-verify's default normalisation (TRL's reward turns off malformed_operators and nits, which then
        # misreads MATH's own shorthand: \frac14 -> 0, 11\sqrt2 -> 242; 7 of MATH-500's reference solutions fail)
        pred_latex = LatexExtractionConfig(boxed_match_priority=0)
        _MV.update(parse=parse, verify=verify, gold_config=[LatexExtractionConfig()],
                   pred_config=[pred_latex, ExprExtractionConfig()])
    return _MV


def parse_gold(gold: str) -> list:
    """Gold answer -> math-verify's parsed list ([] = ungradable). See rule 1 in the module docstring."""
    mv = _mv()
    gold = normalize_answer(gold)
    if not gold:
        return []
    for wrapped in ("$" + gold + "$", "\\boxed{" + gold + "}"):
        parsed = mv["parse"](wrapped, extraction_config=mv["gold_config"], fallback_mode="no_fallback",
                             parsing_timeout=None)
        if parsed:
            return parsed
    return []


def math_verify_inline(completion: str, gold: str, gold_cache: dict | None = None) -> tuple[bool, str | None, bool]:
    """(correct, extracted, gradable) with NO timeout: call only inside the worker (or on trusted input)."""
    mv = _mv()
    if gold_cache is not None and gold in gold_cache:
        gold_parsed = gold_cache[gold]
    else:
        gold_parsed = parse_gold(gold)
        if gold_cache is not None:
            gold_cache[gold] = gold_parsed
    pred, extracted = [], None
    boxed = last_boxed(completion)
    if boxed is not None and boxed.strip():
        pred = mv["parse"]("\\boxed{" + normalize_answer(boxed) + "}", extraction_config=mv["pred_config"],
                           fallback_mode="first_match", parsing_timeout=None)
        extracted = pred[-1] if pred and isinstance(pred[-1], str) else None  # the box's normalised LaTeX
    if not any(not isinstance(p, str) for p in pred) and completion.strip():  # no box, or it did not parse
        pred = mv["parse"](completion, extraction_config=mv["pred_config"], fallback_mode="no_fallback",
                           parsing_timeout=None)
        # parse() does not say which span it read, so the fallback reports the parsed value (sympy's str)
        extracted = str(pred[0]) if pred else extracted
    if not gold_parsed:
        return False, extracted, False
    correct = bool(pred) and bool(mv["verify"](gold_parsed, pred, timeout_seconds=None))
    return correct, extracted, True


# --- the worker subprocess ----------------------------------------------------------------------------------------

_HEADER = struct.Struct("<Q")


def _write_frame(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _worker_main() -> None:
    """Loop: read (completion, gold), answer (correct, extracted, gradable) or ("error", message)."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints from sympy & co. must not corrupt the protocol stream
    inp = sys.stdin.buffer
    gold_cache: dict = {}
    math_verify_inline("\\boxed{\\frac{1}{2}}", "\\frac12", gold_cache)  # warm up antlr and regex caches
    gold_cache.clear()
    _write_frame(out, ("ready", os.getpid()))
    while True:
        header = inp.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return  # parent closed the pipe
        (size,) = _HEADER.unpack(header)
        completion, gold = pickle.loads(inp.read(size))
        try:
            result = ("ok", *math_verify_inline(completion, gold, gold_cache))
        except Exception as exc:  # a math-verify bug on one item must not kill the batch
            result = ("error", f"{type(exc).__name__}: {exc}"[:500])
        _write_frame(out, result)


class _WorkerTimeout(Exception):
    pass


class _Worker:
    """The parent's handle on one scoring subprocess."""

    def __init__(self) -> None:
        self.stderr = tempfile.TemporaryFile()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        env.setdefault("OMP_NUM_THREADS", "1")
        self.proc = subprocess.Popen([sys.executable, "-m", "harness.data.scoring", "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, env=env, cwd=str(REPO_ROOT))
        self.fd = self.proc.stdout.fileno()
        self.ready = False  # the "ready" frame is awaited lazily, so a replacement imports while we carry on

    def wait_ready(self) -> None:
        if self.ready:
            return
        try:
            self._read(time.monotonic() + WORKER_START_TIMEOUT_S)
        except (_WorkerTimeout, EOFError) as exc:
            self.stderr.seek(0)
            tail = self.stderr.read()[-2000:].decode(errors="replace")
            self.kill()
            raise RuntimeError(f"math-verify scoring worker failed to start ({type(exc).__name__}); "
                               f"stderr:\n{tail}") from None
        self.ready = True

    def _read_exact(self, n: int, deadline: float) -> bytes:
        chunks, got = [], 0
        while got < n:
            # a reply already waiting counts even when the deadline has just passed (another worker was served)
            if not select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise _WorkerTimeout
            chunk = os.read(self.fd, min(n - got, 1 << 20))
            if not chunk:
                raise EOFError("scoring worker exited")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _read(self, deadline: float):
        (size,) = _HEADER.unpack(self._read_exact(_HEADER.size, deadline))
        return pickle.loads(self._read_exact(size, deadline))

    def score(self, completion: str, gold: str, timeout_s: float):
        self.wait_ready()
        deadline = time.monotonic() + timeout_s
        _write_frame(self.proc.stdin, (completion, gold))
        return self._read(deadline)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.stderr.close()


_LOCK = threading.Lock()
_WORKERS: dict[int, list[_Worker]] = {}  # pid -> pool; a forked child must not talk to its parent's workers


def _pool(size: int) -> list[_Worker]:
    """This process's first ``size`` workers, started (concurrently) where missing or dead."""
    pool = _WORKERS.setdefault(os.getpid(), [])
    for slot, worker in enumerate(pool[:size]):
        if worker.proc.poll() is not None:
            worker.kill()
            pool[slot] = _Worker()
    pool.extend(_Worker() for _ in range(size - len(pool)))
    return pool[:size]


def _replace(pool: list[_Worker], slot: int) -> None:
    """Kill the worker in ``slot`` and start its replacement now: it imports sympy while the others carry on."""
    pool[slot].kill()
    pool[slot] = _WORKERS[os.getpid()][slot] = _Worker()


def _after_fork_in_child() -> None:
    # The child must not share the parent's workers (or a lock another parent thread held at fork time).
    global _LOCK
    _LOCK = threading.Lock()
    _WORKERS.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def shutdown_worker() -> None:
    """Stop this process's scoring workers (each also exits by itself when our end of its stdin closes)."""
    with _LOCK:
        for worker in _WORKERS.pop(os.getpid(), []):
            worker.kill()


# Recent math-verify results, so a caller that scores the same completions twice (lm-eval's process_results, then
# harness.evaluation.driver's per-sample file) pays once. Keyed by a digest of the completion, not the text, to bound
# memory.
_CACHE: OrderedDict[tuple, Score] = OrderedDict()
CACHE_SIZE = 65536


def _cache_key(completion: str, gold: str, timeout_s: float) -> tuple:
    return gold, timeout_s, hashlib.blake2b(completion.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _score_math_verify_batch(completions: list[str], golds: list[str], timeout_s: float,
                             workers: int = 1) -> list[Score]:
    with _LOCK:
        keys = [_cache_key(c, g, timeout_s) for c, g in zip(completions, golds, strict=True)]
        todo = {}  # first index of each key not cached: a completion repeated in the batch is scored once
        for index, key in enumerate(keys):
            if key not in _CACHE:
                todo.setdefault(key, index)
        scored = _score_on_pool([(i, completions[i], golds[i]) for i in todo.values()], timeout_s, workers)
        fresh = {}
        for index, (score, cacheable) in scored.items():
            fresh[keys[index]] = score
            if cacheable:
                _CACHE[keys[index]] = score
        scores = []
        for key in keys:
            if key in _CACHE:
                _CACHE.move_to_end(key)
            scores.append(fresh.get(key) or _CACHE[key])
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
        return scores


def _score_on_pool(items: list[tuple[int, str, str]], timeout_s: float, workers: int) -> dict[int, tuple]:
    """index -> (score, cacheable) for each (index, completion, gold), on up to ``workers`` workers at once; each
    item's clock starts when a ready worker receives it. A timeout is final (the worker is replaced); an item whose
    worker dies (e.g. killed, out of memory) gets one retry on a fresh worker."""
    pending, retried, results = list(reversed(items)), set(), {}
    pool = _pool(min(workers, len(items))) if items else []
    busy: dict[int, tuple[tuple, float]] = {}  # slot -> (item, deadline)
    while pending or busy:
        for slot, worker in enumerate(pool):
            if slot not in busy and worker.ready and pending:
                item = pending.pop()
                try:
                    _write_frame(worker.proc.stdin, item[1:])
                except BrokenPipeError:
                    pending.append(item)
                    _replace(pool, slot)
                    continue
                busy[slot] = (item, time.monotonic() + timeout_s)
        starting = [slot for slot, worker in enumerate(pool) if not worker.ready]
        if not busy:  # every idle worker is still starting: wait for one (its start-up is not an item's time)
            pool[starting[0]].wait_ready()
            continue
        waiting = select.select([pool[s].fd for s in [*busy, *starting]], [], [],
                                max(0.0, min(deadline for _, deadline in busy.values()) - time.monotonic()))[0]
        for slot in starting:
            if pool[slot].fd in waiting:
                pool[slot].wait_ready()
        for slot, (item, deadline) in list(busy.items()):
            if pool[slot].fd not in waiting and time.monotonic() < deadline:
                continue
            del busy[slot]
            try:
                results[item[0]] = _reply_score(pool[slot]._read(deadline), item[1]), True
            except _WorkerTimeout:  # killed mid-item; a fresh worker takes the next item
                _replace(pool, slot)
                results[item[0]] = Score(False, None, last_boxed(item[1]) is not None, True, timed_out=True), True
            except EOFError:
                _replace(pool, slot)
                if item[0] in retried:
                    results[item[0]] = Score(False, None, last_boxed(item[1]) is not None, True, False), False
                else:
                    retried.add(item[0])
                    pending.append(item)
    return results


def _reply_score(reply: tuple, completion: str) -> Score:
    format_ok = last_boxed(completion) is not None
    if reply[0] == "error":  # math-verify raised on this item: wrong, like an unparsable answer
        return Score(False, None, format_ok, gradable=True, timed_out=False)
    _, correct, extracted, gradable = reply
    return Score(correct, extracted, format_ok, gradable, timed_out=False)


# --- public entry points ------------------------------------------------------------------------------------------


def score_math_verify(completion: str, gold: str, timeout_s: float) -> Score:
    """math-verify equivalence of the (boxed-first) extracted answer with the gold, within ``timeout_s``."""
    return _score_math_verify_batch([completion], [gold], timeout_s)[0]


def score_batch(completions: list[str], golds: list[str], scorer: str, timeout_s: float,
                workers: int = 1) -> list[Score]:
    """Score ``completions[i]`` against ``golds[i]``; ``timeout_s`` bounds each math-verify item, scored on up to
    ``workers`` worker processes at once (the scores do not depend on it)."""
    if len(completions) != len(golds):
        raise ValueError(f"score_batch: {len(completions)} completions but {len(golds)} golds")
    if scorer == "numeric":
        return [score_numeric(c, g) for c, g in zip(completions, golds, strict=True)]
    if scorer == "math_verify":
        if timeout_s <= 0:
            raise ValueError(f"score_batch: timeout_s must be > 0, got {timeout_s}")
        return _score_math_verify_batch(list(completions), list(golds), timeout_s, workers)
    raise ValueError(f"unknown scorer {scorer!r}; known scorers: {list(SCORERS)}")


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    _worker_main()
