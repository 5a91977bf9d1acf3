"""Hostile chat templates: the sandbox holds (no escape), and every render is bounded in time and
size, so a template that loops, blows up a string or asks for a huge range fails its request with
a reason, quickly, instead of hanging the run or filling memory."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from analyzer.chat import ChatRenderer, chat_renderer
from analyzer.errors import BadLine, PrefixcheckError
from analyzer.sandbox import render_watch
from analyzer.tokenizer import SpecialTokens

SPECIAL = SpecialTokens(eos_token="<|im_end|>")
MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture(autouse=True)
def _short_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("analyzer.sandbox.RENDER_SECONDS", 0.3)  # 2 s in a run; quick here


ESCAPES = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.system('echo pwned') }}",
    "{{ self._TemplateReference__context.cycler.__init__.__globals__ }}",
    "{{ raise_exception.__globals__ }}",
    "{% set x = messages.append(1) %}",  # the immutable sandbox: no mutation
    "{{ strftime_now.__self__.__class__ }}",
]
BLOW_UPS = [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}",
    "{% set l = range(100000)|list %}{% for a in l %}{% for b in l %}{% endfor %}{% endfor %}",
    "{{ lipsum(1000000) }}",
    "{{ 'a' * 10**10 }}",
    "{{ 'a' * 1000000000 }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}{{ ns.s|length }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
    "{% endfor %}",
    "{{ 'x'.center(10**10) }}",
    "{{ 'x'|center(10**10) }}",
    "{{ 'x'.ljust(999999999) }}",
    "{{ 10 ** 100000000 }}",
    "{% set n = 10 ** 1000 %}{{ n ** n }}",
    "{{ (range(10**6)|list) * 10**6 }}",
    "{{ 'ab'|indent(10**10) }}",
    "{% for i in range(10**5) %}{{ 'y' * 1000 }}{% endfor %}",  # 100M characters of output
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",  # unbounded recursion
]


@pytest.mark.parametrize("source", ESCAPES)
def test_sandbox_holds(source: str) -> None:
    renderer = ChatRenderer(source, SPECIAL)
    try:
        text = renderer.render(MESSAGES)
    except BadLine as exc:
        assert "chat template failed" in exc.reason
    else:
        assert "pwned" not in text and "subprocess" not in text and "<module" not in text


@pytest.mark.parametrize("source", BLOW_UPS)
def test_hostile_template_fails_its_request_within_bounds(source: str) -> None:
    renderer = ChatRenderer(source, SPECIAL)
    start = time.monotonic()
    with pytest.raises(BadLine, match="chat template failed"):
        renderer.render(MESSAGES)
    assert time.monotonic() - start < 10  # RENDER_SECONDS is 2; slack for a loaded CI machine


@pytest.mark.parametrize("hooks", [True, False], ids=["hooks", "timer-only"])
def test_hostile_templates_fail_their_requests_under_one_watch(
    monkeypatch: pytest.MonkeyPatch, hooks: bool
) -> None:
    """Inside ``render_watch`` (a chunk's renders) one ticking timer bounds every render, with
    the hooks' checks or without them (a loop that touches none): each blow-up fails its own
    request, an ordinary render between them still renders, and the timer and the handler are
    put back after."""
    if not hooks:
        monkeypatch.setattr("analyzer.sandbox._check_time", lambda: None)
    before = signal.getsignal(signal.SIGALRM)
    ordinary = ChatRenderer("{{ messages[0]['content'] }}", SPECIAL)
    with render_watch():
        for source in BLOW_UPS[:3]:
            start = time.monotonic()
            with pytest.raises(BadLine, match="chat template failed"):
                ChatRenderer(source, SPECIAL).render(MESSAGES)
            assert time.monotonic() - start < 10
            assert ordinary.render(MESSAGES) == "hello"
        assert signal.getitimer(signal.ITIMER_REAL)[1] > 0  # ticking
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is before


def test_hostile_templates_fail_off_the_main_thread() -> None:
    """A thread has no timer signal: the hooks' deadline checks alone stop its renders."""
    results: list[str] = []

    def render_all() -> None:
        for source in BLOW_UPS[:3]:
            start = time.monotonic()
            try:
                ChatRenderer(source, SPECIAL).render(MESSAGES)
            except BadLine as exc:
                results.append(f"{exc.reason} in {time.monotonic() - start:.1f} s")

    worker = threading.Thread(target=render_all)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert len(results) == 3 and all("ran over 0.3 s" in result for result in results)


@pytest.mark.parametrize(
    ("template", "why"),
    [
        (42, "is not a string"),
        (["{{ x }}"], "is not a string"),
        ({"default": 5}, "is not a string"),
        ("{% for %}", "does not compile"),
        ("{% if x %}" * 3000, "does not compile"),  # nested too deeply for the parser
    ],
)
def test_template_that_is_not_a_template_is_a_clear_error(template: object, why: str) -> None:
    with pytest.raises(PrefixcheckError, match=why):
        chat_renderer(template, SPECIAL)  # type: ignore[arg-type]


def test_ordinary_templates_still_render() -> None:
    renderer = chat_renderer(None, SPECIAL)
    text = renderer.render(MESSAGES * 200)
    assert text.count("<|im_start|>user\nhello<|im_end|>") == 200
    looped = ChatRenderer("{% for i in range(3) %}{{ i }}{% endfor %}{{ 'ab' * 3 }}", SPECIAL)
    assert looped.render(MESSAGES) == "012ababab"


def test_the_bounded_sandbox_reads_and_joins_as_jinjas_own() -> None:
    """The sandbox's quick paths (a dict's item read as an attribute, str + str) give what
    jinja2's immutable sandbox gives: a dict's methods win over its keys, a missing key is
    undefined, and the other operands take jinja2's own path."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from analyzer.sandbox import BoundedSandbox

    source = (
        "{% for m in messages %}{{ m.role + ':' + m.content }}|{{ m.items is callable }}|"
        "{{ m.get('role') }}|{{ m.missing is defined }}|{{ m.missing | default('none') }}|"
        "{{ m.role + 1 if m.role is number else m.role * 2 }}|{{ m.count + 1 }}|"
        "{{ [1] + [2] }}|{{ (m.content ~ '!') + '?' }}\n{% endfor %}"
    )
    messages = [
        {"role": "user", "content": "hello", "items": "a key", "count": 3},
        {"role": "assistant", "content": "hi", "get": "shadowed", "count": -1},
    ]
    ours = BoundedSandbox().from_string(source).render(messages=messages)
    theirs = ImmutableSandboxedEnvironment().from_string(source).render(messages=messages)
    assert ours == theirs
    assert "user:hello|True|user|False|none|useruser|4|[1, 2]|hello!?" in ours
