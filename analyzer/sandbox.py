"""A bounded jinja2 sandbox for chat templates: jinja2's immutable sandbox (no attribute escapes,
no mutation), plus limits on time and size, so that a hostile template fails one request with a
reason instead of hanging the run or filling memory.

- Time: each render has RENDER_SECONDS. On the main thread a timer signal interrupts it (armed
  for each render, or once for a run of them: ``render_watch``); on another thread, which no
  signal reaches, every attribute, item, call, filter, operator, ``~``, ``range`` step and loop
  step checks the deadline (the clock reads they skip under a timer were about a tenth of a chat
  log's renders).
- Size: the rendered text, and every string or list an operator, ``~``, a filter or a method call
  makes, is at most MAX_TEMPLATE_CHARS; an integer argument above that (``center(10**9)``) and
  an exponent that makes a huge number are refused before they run.
- ``lipsum`` is gone (no chat template uses it; ``lipsum(10**6)`` writes megabytes).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.ext import loopcontrols
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment

RENDER_SECONDS = 2.0  # real chat templates render a request in milliseconds
WATCH_SECONDS = 0.25  # ``render_watch``'s tick: a render is stopped by RENDER_SECONDS + this
MAX_TEMPLATE_CHARS = 32 << 20  # 32M characters, about 8M tokens: over any model's context
MAX_POWER_BITS = 4096  # ``a ** b`` with a result of more bits is refused


_DICT_ATTRIBUTES = frozenset(dir(dict))  # ``message.items`` is the method, not a key


class TemplateLimit(jinja2.exceptions.TemplateError):
    """A render over its time or size bound."""


class _Deadline(threading.local):
    at: float | None = None  # the hooks' deadline: None outside a render or under a timer


_DEADLINE = _Deadline()


def _check_time() -> None:
    at = _DEADLINE.at
    if at is not None and time.monotonic() > at:
        raise TemplateLimit(f"chat template ran over {RENDER_SECONDS:g} s")


def _check_size(value: Any) -> Any:
    if isinstance(value, str | list | tuple | bytes) and len(value) > MAX_TEMPLATE_CHARS:
        raise TemplateLimit(f"chat template made a value over {MAX_TEMPLATE_CHARS:,} long")
    return value


def _check_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_TEMPLATE_CHARS:
            raise TemplateLimit(f"chat template passed {value} to a call (over the size bound)")


def _bounded_range(*args: int) -> Iterator[int]:
    """``range`` that checks the deadline as it goes (jinja2's sandbox caps its length only)."""
    numbers = range(*args)
    if len(numbers) > MAX_TEMPLATE_CHARS:
        raise TemplateLimit(f"chat template asked for a range of {len(numbers):,}")
    for count, number in enumerate(numbers):
        if count % 1024 == 0:
            _check_time()
        yield number


def _bounded_loop(iterable: Any) -> Any:
    """What a ``for`` loops over: as it is under a timer signal, else checked against the
    deadline as it goes (a loop whose body is empty touches no other hook)."""
    if _DEADLINE.at is None:
        return iterable
    return _checked_loop(iterable)


def _checked_loop(iterable: Any) -> Iterator[Any]:
    for count, item in enumerate(iterable):
        if count % 1024 == 0:
            _check_time()
        yield item


BOUNDED_LOOP = "prefixcheck_bounded_loop"  # the filter every ``for`` loop's iterable goes through


def _bounded_filter(function: Callable[..., Any]) -> Callable[..., Any]:
    # The value filtered comes after the context or environment a filter may take first.
    first = 2 if getattr(function, "jinja_pass_arg", None) is not None else 1

    def bounded(*args: Any, **kwargs: Any) -> Any:
        _check_time()
        _check_arguments(args[first:], kwargs)
        return _check_size(function(*args, **kwargs))

    for name in ("jinja_pass_arg", "__name__", "__doc__"):
        if hasattr(function, name):
            with contextlib.suppress(AttributeError, TypeError):
                setattr(bounded, name, getattr(function, name))
    return bounded


class _BoundedCodeGenerator(CodeGenerator):
    """Compiles ``a ~ b`` to a size-checked join (jinja2's own is a plain ``str.join``)."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.bounded_join((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox with the bounds above."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"+", "*", "**", "%", "//", "/", "-"})

    def __init__(self, extensions: Sequence[Any] = (), **options: Any) -> None:
        super().__init__(**options, extensions=[loopcontrols, *extensions])
        self.globals.pop("lipsum", None)
        self.globals["range"] = _bounded_range
        self.filters = {name: _bounded_filter(f) for name, f in self.filters.items()}
        self.filters[BOUNDED_LOOP] = _bounded_loop

    def _generate(
        self,
        source: nodes.Template,
        name: str | None,
        filename: str | None,
        defer_init: bool = False,
    ) -> str:
        for loop in list(source.find_all(nodes.For)):  # each ``for``'s iterable is bounded
            loop.iter = nodes.Filter(
                loop.iter, BOUNDED_LOOP, [], [], None, None, lineno=loop.lineno
            )
        return super()._generate(source, name, filename, defer_init)

    def make_globals(self, d: MutableMapping[str, Any] | None) -> MutableMapping[str, Any]:
        """A template's globals as one dict over the environment's (the same lookups as
        jinja2's ``ChainMap``, the environment's being set before a template compiles): each
        render copies them into its context, and a ``ChainMap``'s copy was about a tenth of a
        render."""
        return {**self.globals, **(d or {})}

    def add_filter(self, name: str, function: Callable[..., Any]) -> None:
        self.filters[name] = _bounded_filter(function)

    def bounded_join(self, parts: tuple[Any, ...]) -> str:
        _check_time()
        if sum(len(p) if isinstance(p, str) else 64 for p in parts) > MAX_TEMPLATE_CHARS:
            raise TemplateLimit(f"chat template made a string over {MAX_TEMPLATE_CHARS:,} long")
        return _check_size("".join(map(str, parts)))

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        _check_time()
        if operator == "+" and type(left) is str and type(right) is str:  # the common case
            if len(left) + len(right) > MAX_TEMPLATE_CHARS:
                raise TemplateLimit(f"chat template made a value over {MAX_TEMPLATE_CHARS:,} long")
            return left + right
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if (
                    isinstance(seq, str | list | tuple)
                    and isinstance(times, int)
                    and len(seq) * times > MAX_TEMPLATE_CHARS
                ):
                    raise TemplateLimit(
                        f"chat template made a value over {MAX_TEMPLATE_CHARS:,} long"
                    )
        elif operator == "**" and isinstance(left, int) and isinstance(right, int):
            if right > 0 and abs(left) > 1 and left.bit_length() * right > MAX_POWER_BITS:
                raise TemplateLimit("chat template computed a power over 4096 bits")
        elif (
            operator == "+"
            and isinstance(left, str | list | tuple)
            and isinstance(right, str | list | tuple)
            and len(left) + len(right) > MAX_TEMPLATE_CHARS
        ):
            raise TemplateLimit(f"chat template made a value over {MAX_TEMPLATE_CHARS:,} long")
        return _check_size(super().call_binop(context, operator, left, right))

    def getattr(self, obj: Any, attribute: str) -> Any:
        _check_time()
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            # What jinja2's sandbox gives, without its failed attribute lookup first (a dict has
            # no such attribute): the item, else undefined.
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _check_time()
        return super().getitem(obj, argument)

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _check_time()
        if isinstance(getattr(__obj, "__self__", None), str | list | tuple | bytes):
            _check_arguments(args, kwargs)  # "x".center(10**9), "ab".zfill(...), [..].index
        return _check_size(super().call(__context, __obj, *args, **kwargs))


def render_bounded(template: jinja2.Template, variables: dict[str, Any]) -> str:
    """The template's text, within RENDER_SECONDS and MAX_TEMPLATE_CHARS."""
    deadline = time.monotonic() + RENDER_SECONDS
    try:
        with _alarm(deadline) as timed:
            _DEADLINE.at = None if timed else deadline
            size, parts = 0, []
            for part in template.generate(**variables):
                size += len(part)
                if size > MAX_TEMPLATE_CHARS:
                    raise TemplateLimit(
                        f"chat template wrote over {MAX_TEMPLATE_CHARS:,} characters"
                    )
                parts.append(part)
                _check_time()
            return "".join(parts)
    finally:
        _DEADLINE.at = None


class _Alarm:
    active = False  # a render runs under the timer
    watching = False  # a ``render_watch`` keeps the timer ticking
    deadline = 0.0  # the render's, for the ticks of a watch


def _on_alarm(signum: int, frame: object) -> None:
    if _Alarm.active and (not _Alarm.watching or time.monotonic() > _Alarm.deadline):
        raise TemplateLimit(f"chat template ran over {RENDER_SECONDS:g} s")


@contextlib.contextmanager
def render_watch() -> Iterator[None]:
    """The renders inside share one timer signal (main thread): it ticks every WATCH_SECONDS
    and stops a render past its deadline, instead of a handler and a timer set and reset
    around each render (four system calls a request: a tenth of a chat log's reading)."""
    if threading.current_thread() is not threading.main_thread() or _Alarm.watching:
        yield
        return
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    _Alarm.watching = True
    signal.setitimer(signal.ITIMER_REAL, WATCH_SECONDS, WATCH_SECONDS)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _Alarm.watching = False
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def _alarm(deadline: float) -> Iterator[bool]:
    """A timer signal that stops the render at ``deadline``, on the main thread; whether there
    is one (another thread has only the hooks' checks)."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    if _Alarm.watching:  # the watch's timer ticks already
        _Alarm.active, _Alarm.deadline = True, deadline
        try:
            yield True
        finally:
            _Alarm.active = False
        return
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    _Alarm.active = True
    signal.setitimer(signal.ITIMER_REAL, max(deadline - time.monotonic(), 1e-3))
    try:
        yield True
    finally:
        _Alarm.active = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
