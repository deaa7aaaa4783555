"""Tokenizing processes: a worker's tokenizer run in processes of its own, as torch's DataLoader
runs its workers beside the training loop.

Threads scale the Rust tokenizer over a node's cores (it releases the GIL), but not what runs in
Python around it: the word cache (helpers.workloads.embedding.word_cache), which tokenizes most
texts in Python's string methods, or a tokenizer's own Python. The GPU check on an H200's 16
cores fed a simulated card 16 % with one process of 16 tokenizing threads, 21 % with two of 8:
the threads queued for the GIL (ANCHORS.md). ``TokenizerProcesses`` runs ``processes`` children,
each holding its own copy of the tokenizer; the worker's thread sends each a chunk of texts and
goes on (collating, submitting to the card), and a reader thread per child hands back its ids as
they come. A chunk travels as a pickle of its texts one way and two int32 arrays the other (a
chunk of 64 paragraphs: ~20 KB of ids), over a pipe of the child's own.

The children are ``python -m helpers.workloads.embedding.tokenizing`` (subprocesses: an engine
worker process is daemonic, and multiprocessing gives a daemonic process no children). A child
reads until its pipe closes: when the worker closes the pool, exits or is killed, its children
see the end of their input and exit, so nothing outlives the worker. A child that dies fails
the chunks it held with an error naming its pid and how it ended.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import Future
from itertools import chain
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

START_TIMEOUT = 60.0  # seconds a child may take to say it is ready (imports, the tokenizer)


class TokenizingError(RuntimeError):
    """A tokenizing process failed or ended."""


def spec_of(tokenizer: Any) -> dict[str, Any]:
    """What a child needs to build ``tokenizer`` (a RustTokenizer, or a WordCache in front of
    one) anew: the Rust tokenizer's JSON (its truncation included), its padding id and length,
    and whether the word cache stands in front."""
    rust = getattr(tokenizer, "tokenizer", tokenizer)  # (a WordCache's own RustTokenizer)
    direction = (rust.rust.truncation or {}).get("direction", "right")
    return {"json": rust.rust.to_str(), "pad_id": rust.pad_id, "max_length": rust.max_length,
            "side": str(direction).lower(), "word_cache": rust is not tokenizer}


def build(spec: dict[str, Any]) -> Any:
    """The tokenizer ``spec_of`` described."""
    from tokenizers import Tokenizer

    from helpers.workloads.embedding.rust_tokenizer import RustTokenizer
    from helpers.workloads.embedding.word_cache import WordCache

    rust = RustTokenizer(Tokenizer.from_str(spec["json"]), spec["pad_id"], spec["max_length"],
                         spec["side"])
    return WordCache(rust) if spec["word_cache"] else rust


class _Child:
    """One tokenizing process, its pipes, the chunks it holds (by number), and whether it has
    ended (``dead``: set, under ``state``, by its reader when its answers end)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()
        path = os.pathsep.join(p for p in sys.path if p)  # (``helpers`` where the worker
        # found it, whatever the child's working folder)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "helpers.workloads.embedding.tokenizing",
             "--read", str(to_child), "--write", str(from_child)],
            pass_fds=(to_child, from_child), stdin=subprocess.DEVNULL,
            env={**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": path})
        os.close(to_child)  # (one core each: the children are the parallelism)
        os.close(from_child)
        self.send, self.receive = Connection(from_parent, readable=False), \
            Connection(to_parent, writable=False)
        self.held: dict[int, Future] = {}
        self.lock, self.state, self.dead = threading.Lock(), threading.Lock(), False
        try:
            self._expect("listening")  # (its imports done: it reads what is sent)
            self.send.send(spec)
            self._expect("ready")
        except BaseException:
            self.process.kill()
            self.process.wait()
            self.send.close()
            self.receive.close()
            raise

    def _expect(self, word: str) -> None:
        """Wait for the child to say ``word``; TokenizingError naming its pid and how it ended
        (or what it said) where it does not, within START_TIMEOUT."""
        heard = self.receive.poll(START_TIMEOUT)
        try:
            said = self.receive.recv() if heard else None
        except (EOFError, OSError):  # (it ended: ``ended`` waits for its exit status)
            said = None
        if said == word:
            return
        if not heard:
            raise TokenizingError(f"a tokenizing process (pid {self.process.pid}) did not say "
                                  f"{word} within {START_TIMEOUT:.0f} s")
        raise TokenizingError(f"a tokenizing process (pid {self.process.pid}) could not start: "
                              f"{said if said is not None else self.ended()}")

    def ended(self) -> str:
        """How the process ended, in words (it has, or is ending)."""
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "still running"
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exit code {code}"


class TokenizerProcesses:
    """``processes`` children tokenizing with copies of ``tokenizer`` (the module docstring):
    ``submit(texts)`` is a Future of (the texts' ids, the child's CPU seconds, the texts the word
    cache tokenized); ``close()`` ends them (also when the pool is collected)."""

    def __init__(self, tokenizer: Any, processes: int) -> None:
        self.pad_id, self.processes = tokenizer.pad_id, processes
        spec = spec_of(tokenizer)
        self._children: list[_Child] = []
        try:
            for _ in range(processes):
                self._children.append(_Child(spec))
        except BaseException:
            _close(self._children)
            raise
        self._numbers = iter(range(2**62))
        self._lock = threading.Lock()
        for child in self._children:  # (the readers hold the children, not the pool: a pool
            threading.Thread(target=_read, args=(child,), daemon=True,  # no one holds closes)
                             name=f"gpufeed-tokenizing-{child.process.pid}").start()
        self._finalize = weakref.finalize(self, _close, self._children)

    def submit(self, texts: list[str]) -> Future:
        """The ids of ``texts`` from the living child holding the fewest chunks;
        TokenizingError where none is left (each one's end named)."""
        future: Future = Future()
        while True:
            with self._lock:
                number = next(self._numbers)
                living = [c for c in self._children if not c.dead]
                if not living:
                    raise TokenizingError("every tokenizing process has ended: " + "; ".join(
                        f"pid {c.process.pid} ({c.ended()})" for c in self._children))
                child = min(living, key=lambda c: len(c.held))
            with child.state:
                if child.dead:
                    continue  # (it ended while chosen: another)
                child.held[number] = future
            try:
                with child.lock:
                    child.send.send((number, texts))
            except OSError:
                with child.state:
                    child.dead = True
                    child.held.pop(number, None)
                continue
            return future

    def pids(self) -> list[int]:
        return [child.process.pid for child in self._children]

    def close(self) -> None:
        """End the children (their input closes; they exit) and wait for them."""
        self._finalize()


def _read(child: _Child) -> None:
    """Hand each answer of ``child`` to its chunk's future; at the child's end (or an answer
    that cannot be read), mark it dead and fail the chunks it still held, naming how it
    ended: the pool sends its siblings the rest."""
    while True:
        try:
            number, lengths, flat, cpu, fast, error = child.receive.recv()
        except Exception:  # noqa: BLE001 (EOF, a closed pipe, a broken answer: it is done)
            break
        with child.state:
            future = child.held.pop(number, None)
        if future is None:
            continue
        if error is not None:
            future.set_exception(TokenizingError(f"tokenizing process (pid "
                                                 f"{child.process.pid}): {error}"))
            continue
        ids, edges = flat.tolist(), np.concatenate(([0], np.cumsum(lengths))).tolist()
        future.set_result(([ids[a:b] for a, b in zip(edges, edges[1:])], cpu, fast))
    with child.state:
        child.dead = True
        held, child.held = list(child.held.values()), {}
    if held:
        how = child.ended()
        for future in held:
            future.set_exception(TokenizingError(
                f"the tokenizing process (pid {child.process.pid}) ended ({how}) holding a "
                f"chunk of texts"))


def _close(children: list[_Child]) -> None:
    for child in children:
        try:
            child.send.close()  # (the child reads the end of its input and exits)
        except OSError:
            pass
    deadline = time.monotonic() + 5.0
    for child in children:
        try:
            child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()
        child.receive.close()


def main(argv: list[str] | None = None) -> int:
    """A child: build the tokenizer it is sent, then tokenize each chunk until its input ends."""
    parser = argparse.ArgumentParser(prog="python -m helpers.workloads.embedding.tokenizing")
    parser.add_argument("--read", type=int, required=True)
    parser.add_argument("--write", type=int, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Ctrl-C is the worker's to handle: the
    # child ends when its input does)
    receive, send = Connection(args.read, writable=False), Connection(args.write, readable=False)
    send.send("listening")
    try:
        tokenizer = build(receive.recv())
    except Exception as exc:  # noqa: BLE001 (said to the parent, which raises it)
        send.send(f"{type(exc).__name__}: {exc}")
        return 1
    send.send("ready")
    fast = getattr(tokenizer, "last_fast", lambda: 0)
    while True:
        try:
            number, texts = receive.recv()
        except (EOFError, OSError):
            return 0
        started = time.thread_time()
        try:
            ids = tokenizer.encode(texts)
        except Exception as exc:  # noqa: BLE001 (the chunk fails, not the child)
            send.send((number, None, None, 0.0, 0, f"{type(exc).__name__}: {exc}"))
            continue
        lengths = np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))
        flat = np.fromiter(chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum()))
        send.send((number, lengths, flat, time.thread_time() - started, fast(), None))


if __name__ == "__main__":
    sys.exit(main())
