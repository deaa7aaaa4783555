"""What a worker keeps open between workunits (helpers.engine.inputs.open_files): the latest few
by key, the oldest closed past the limit, one not usable replaced, everything closed with the
process's inputs."""
import threading

from helpers.engine.contract.protocol import close_inputs
from helpers.engine.inputs.open_files import OpenFiles


class Handle:
    def __init__(self, name):
        self.name, self.closed, self.at = name, False, 0

    def close(self):
        self.closed = True


def test_the_latest_are_kept_and_the_oldest_closed_past_the_limit():
    opened = []
    cache = OpenFiles(2, Handle.close, with_inputs=False)

    def get(name):
        return cache.get(name, lambda: opened.append(Handle(name)) or opened[-1])

    a, b = get("a"), get("b")
    assert get("a") is a and len(opened) == 2  # held: not opened again
    c = get("c")  # "b" is now the oldest
    assert b.closed and not a.closed and not c.closed
    assert [h.name for h in cache.values()] == ["a", "c"] and len(cache) == 2
    assert cache.peek("b") is None and cache.peek("a") is a
    assert get("b") is not b and len(opened) == 4  # opened again, "a" closed in its place
    assert a.closed


def test_one_not_usable_is_closed_and_opened_again():
    cache = OpenFiles(4, Handle.close, with_inputs=False)
    first = cache.get("k", lambda: Handle("k"))
    first.at = 100
    again = cache.get("k", lambda: Handle("k"), usable=lambda h: h.at <= 50)  # (a cursor past
    assert again is not first and first.closed  # the rows asked for)
    assert cache.get("k", lambda: Handle("other"), usable=lambda h: True) is again


def test_close_all_closes_everything_and_the_next_get_opens_again():
    cache = OpenFiles(3, Handle.close, with_inputs=False)
    held = [cache.get(n, lambda n=n: Handle(n)) for n in "xyz"]
    cache.close_all()
    assert all(h.closed for h in held) and len(cache) == 0
    assert not cache.get("x", lambda: Handle("x")).closed


def test_a_cache_with_the_inputs_closes_with_them_and_one_inside_another_thing_does_not():
    process_wide = OpenFiles(3, Handle.close)
    inside = OpenFiles(3, Handle.close, with_inputs=False)
    a, b = process_wide.get("a", lambda: Handle("a")), inside.get("b", lambda: Handle("b"))
    close_inputs()
    assert a.closed and len(process_wide) == 0
    assert not b.closed and len(inside) == 1


def test_threads_sharing_it_open_each_key_once():
    opened = []
    lock = threading.Lock()
    cache = OpenFiles(8, Handle.close, with_inputs=False)

    def open_(name):
        with lock:
            opened.append(name)
        return Handle(name)

    def read():
        for n in range(200):
            cache.get(n % 4, lambda n=n: open_(n % 4))

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(opened) == [0, 1, 2, 3]
