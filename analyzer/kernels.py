"""The numba kernels' compilation: reported as it happens, so a first run does not look hung.

Every kernel is compiled with ``cache=True``: the first run after an install (or an upgrade of
the package or of numba) compiles them, about half a minute, and writes them to numba's cache
(``__pycache__`` beside the sources, else ``~/.cache/numba``; ``NUMBA_CACHE_DIR`` overrides);
later runs load them in well under a second. numba broadcasts a ``numba:compile`` event only
when it compiles, never for a cache hit (``numba/core/dispatcher.py``, ``Dispatcher.compile``),
so listening to it tells exactly when a run is compiling.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from numba.core import event


class _CompileListener(event.Listener):
    def __init__(self, on_compile: Callable[[str], None], on_done: Callable[[], None]) -> None:
        self._on_compile = on_compile
        self._on_done = on_done
        self._depth = 0  # a kernel compiles the kernels it calls inside its own compilation
        self._lock = threading.Lock()

    def on_start(self, event: event.Event) -> None:
        function = getattr(event.data["dispatcher"], "py_func", None)
        name = getattr(function, "__qualname__", None) or "kernel"
        module = getattr(function, "__module__", None) or ""
        with self._lock:
            self._depth += 1
            if module.split(".")[0] != "numba":  # not numba's own helpers, compiled inside ours
                self._on_compile(f"{module}.{name}" if module else name)

    def on_end(self, event: event.Event) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                self._on_done()


@contextmanager
def watch_compilation(
    on_compile: Callable[[str], None], on_done: Callable[[], None]
) -> Iterator[None]:
    """Inside the block, call ``on_compile("module.function")`` each time numba compiles a kernel
    (numba's own helpers left out) and ``on_done()`` when it is no longer compiling any."""
    with event.install_listener("numba:compile", _CompileListener(on_compile, on_done)):
        yield
