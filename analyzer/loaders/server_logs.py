"""Server logs, read line by line; lines that are not request or answer lines are reasoned skips.

- vLLM (``--enable-log-requests``; ``--enable-log-outputs`` for answers), from
  ``vllm/entrypoints/logger.py``::

    INFO 06-12 10:30:45 [logger.py:41] Received request chatcmpl-1f2e: prompt: '<|im_start|>...',
    params: SamplingParams(...), prompt_token_ids: [151644, ...], prompt_embeds shape: None,
    lora_request: None.
    INFO 06-12 10:30:46 [logger.py:71] Generated response chatcmpl-1f2e: output: 'Sure...',
    output_token_ids: [39814, ...], finish_reason: stop

  The logged prompt is the rendered chat (chat ids start with ``chatcmpl-``: tokenized without
  special tokens, as vLLM does); ``prompt_token_ids``, when logged, are used as they are. vLLM's
  timestamps have no year: arrival times count from 1 January 2000, in log order.

  Releases 0.2-0.3 (``vllm/engine/async_llm_engine.py``) spelled it ``sampling params: ...,
  prompt token ids: [...]``. Since 0.11 (``vllm/entrypoints/serve/utils/request_logger.py`` in
  0.33) the prompt and ids are on a DEBUG line of their own, the parameters and LoRA on the INFO
  line, and the answer's ids on a DEBUG line beside the INFO answer::

    DEBUG 06-12 10:30:45 [request_logger.py:56] Request chatcmpl-1f2e details: prompt: '...',
    prompt_token_ids: [151644, ...], prompt_embeds shape: None.
    INFO 06-12 10:30:45 [request_logger.py:66] Received request chatcmpl-1f2e: params:
    SamplingParams(...), lora_request: None.
    DEBUG ... Generated response chatcmpl-1f2e details: output_token_ids: [39814, ...]
    INFO ... Generated response chatcmpl-1f2e: output: 'Sure...', finish_reason: stop

  The lines of one request are joined by its id; an INFO line alone (vLLM at INFO logs no
  prompt) is a reasoned skip.

- SGLang (``--log-requests``), from ``tokenizer_manager.py``::

    [2025-06-12 10:30:45] Receive: obj=GenerateReqInput(text='...', input_ids=None, ...,
    sampling_params={...}, rid='5c1e...', ..., lora_path=None, ...)
    [2025-06-12 10:30:46] Finish: obj=GenerateReqInput(...), out={'text': '...', 'meta_info':
    {'id': '5c1e...', 'finish_reason': {'type': 'stop', ...}, 'completion_tokens': 12,
    'cached_tokens': 96, ...}}

  Values are Python reprs: parsed with ``ast`` (never evaluated), one literal at a time.
"""

from __future__ import annotations

import ast
import json
import re
from datetime import UTC, datetime
from typing import Any

from analyzer.errors import BadLine
from analyzer.loaders.fields import cache_fields, count
from analyzer.loaders.joins import Answer
from analyzer.records import Record

VLLM_REQUEST = re.compile(r"(?:Received request|Request) (\S+?)(?: details)?: prompt: ")
VLLM_PARAMS = re.compile(r"Received request (\S+?): params: ")
PROMPT_LOGPROBS = re.compile(r"SamplingParams\(.*?\bprompt_logprobs=(None|-?\d+)")
MAX_TOKENS = re.compile(r"SamplingParams\(.*?\bmax_tokens=(None|\d+)")
VLLM_ANSWER = re.compile(r"Generated response (\S+?)( \(streaming (?:delta|complete)\))?: output: ")
VLLM_ANSWER_IDS = re.compile(
    r"Generated response (\S+?)( \(streaming (?:delta|complete)\))? details: output_token_ids: "
)
VLLM_IDS = (", prompt_token_ids: ", ", prompt token ids: ")  # 0.4 on; 0.2-0.3
VLLM_TIME = re.compile(r"\b(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d+))?\b")
SGLANG_RECEIVE = "Receive: obj="
SGLANG_FINISH = "Finish: obj="
SGLANG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)")
LORA_NAME = re.compile(r"lora_name='([^']*)'")
TRUNCATED = "logged text is truncated (' ... ' in the repr): raise --log-requests-level"


def is_text(line: Any) -> bool:
    return isinstance(line, str)


def matches_vllm(line: str) -> bool:
    return VLLM_REQUEST.search(line) is not None or VLLM_PARAMS.search(line) is not None


def matches_sglang(line: str) -> bool:
    return SGLANG_RECEIVE in line and "GenerateReqInput(" in line


def parse_vllm(line: str, file: str, number: int) -> Record | Answer:
    request = VLLM_REQUEST.search(line)
    if request is None:
        return _vllm_other(line, file, number)
    request_id = request.group(1)
    prompt, end = _python_string(line, request.end())
    rest = line[end:]
    token_ids = None
    for spelling in VLLM_IDS:
        ids_at = rest.rfind(spelling)
        if ids_at >= 0:
            token_ids = _int_list(rest[ids_at + len(spelling) :], "prompt_token_ids")
            break
    if token_ids is None and not prompt:
        raise BadLine(f"request {request_id} logged neither prompt text nor prompt_token_ids")
    lora = LORA_NAME.search(rest[rest.rfind(", lora_request: ") :])
    return Record(
        file=file,
        line=number,
        prompt=None if token_ids is not None else prompt,
        prompt_token_ids=token_ids,
        add_special_tokens=not request_id.startswith("chatcmpl-"),
        lora=lora.group(1) if lora else None,
        prompt_logprobs=_asks_prompt_logprobs(rest),
        max_new_tokens=_max_tokens(rest),
        request_id=request_id,
        arrival_s=_vllm_time(line[: request.start()]),
    )


def _asks_prompt_logprobs(text: str) -> bool | None:
    """From a logged ``SamplingParams(...)``: True when ``prompt_logprobs`` is set (vLLM then
    skips the prefix lookup), None when the line logs no SamplingParams."""
    found = PROMPT_LOGPROBS.search(text)
    return None if found is None else found.group(1) != "None"


def _max_tokens(text: str) -> int | None:
    """From a logged ``SamplingParams(...)``: its ``max_tokens`` (None when unlogged or None)."""
    found = MAX_TOKENS.search(text)
    return None if found is None or found.group(1) == "None" else int(found.group(1))


def _vllm_other(line: str, file: str, number: int) -> Answer:
    """The INFO request line of vLLM >= 0.11 (its LoRA), or an answer line."""
    params = VLLM_PARAMS.search(line)
    if params is not None:
        lora = LORA_NAME.search(line[line.rfind(", lora_request: ") :])
        return Answer(
            request_id=params.group(1),
            file=file,
            line=number,
            lora=lora.group(1) if lora else None,
            prompt_logprobs=_asks_prompt_logprobs(line),
            max_new_tokens=_max_tokens(line),
            orphan_reason=f"request {params.group(1)}: vLLM logged no prompt (it logs prompts "
            "on a DEBUG 'Request ... details' line: run with --log-level DEBUG)",
        )
    ids = VLLM_ANSWER_IDS.search(line)
    if ids is not None:
        if ids.group(2) and "delta" in ids.group(2):
            raise BadLine("streaming delta (the complete answer is logged on its own line)")
        return Answer(
            request_id=ids.group(1),
            file=file,
            line=number,
            output_token_ids=_int_list(line[ids.end() :], "output_token_ids") or None,
        )
    answer = VLLM_ANSWER.search(line)
    if answer is None:
        raise BadLine("not a 'Received request' or 'Generated response' line")
    return _vllm_answer(line, answer, file, number)


def _vllm_answer(line: str, match: re.Match[str], file: str, number: int) -> Answer:
    if match.group(2) and "delta" in match.group(2):
        raise BadLine("streaming delta (the complete answer is logged on its own line)")
    text, end = _python_string(line, match.end())
    rest = line[end:]
    ids_at = rest.find(", output_token_ids: ")
    finish_at = rest.rfind(", finish_reason: ")
    token_ids = None
    if ids_at >= 0:
        token_ids = _int_list(rest[ids_at + len(", output_token_ids: ") :], "output_token_ids")
    finish = rest[finish_at + len(", finish_reason: ") :].strip() if finish_at >= 0 else None
    return Answer(
        request_id=match.group(1),
        file=file,
        line=number,
        output_text=text,
        output_token_ids=token_ids or None,
        finish_reason=None if finish in (None, "None") else finish,
    )


def parse_sglang(line: str, file: str, number: int) -> Record | Answer:
    if SGLANG_FINISH in line:
        return _sglang_answer(line, file, number)
    at = line.find(SGLANG_RECEIVE)
    if at < 0:
        raise BadLine("not a 'Receive: obj=' or 'Finish: obj=' line")
    fields = _dataclass_fields(_strip_headers(line[at + len(SGLANG_RECEIVE) :]))
    text, input_ids = fields.get("text"), fields.get("input_ids")
    if isinstance(text, list) or (input_ids and isinstance(input_ids[0], list)):
        raise BadLine("a batch request (several prompts in one GenerateReqInput) is not read")
    if input_ids is None and not isinstance(text, str):
        raise BadLine("GenerateReqInput has neither text nor input_ids")
    rid = fields.get("rid")
    return Record(
        file=file,
        line=number,
        prompt=text if input_ids is None else None,
        prompt_token_ids=_checked_ids(input_ids) if input_ids is not None else None,
        lora=_optional_str(fields.get("lora_path")),
        cache_salt=_optional_str(fields.get("cache_salt")),
        **cache_fields(fields),
        request_id=str(rid) if rid is not None else None,
        arrival_s=_sglang_time(line),
    )


def _sglang_answer(line: str, file: str, number: int) -> Answer:
    body = line[line.find(SGLANG_FINISH) + len(SGLANG_FINISH) :]
    out_at = body.rfind(", out=")
    if out_at < 0:
        raise BadLine("'Finish:' line without 'out=' (no answer logged)")
    out = _literal(body[out_at + len(", out=") :], "out")
    if not isinstance(out, dict):
        raise BadLine("'out=' is not a dict")
    meta = out.get("meta_info") if isinstance(out.get("meta_info"), dict) else {}
    finish = meta.get("finish_reason")
    rid = meta.get("id") or _dataclass_fields(_strip_headers(body[:out_at])).get("rid")
    if rid is None:
        raise BadLine("'Finish:' line names no request id")
    output_ids = out.get("output_ids")
    return Answer(
        request_id=str(rid),
        file=file,
        line=number,
        output_text=out.get("text") if isinstance(out.get("text"), str) else None,
        output_token_ids=_checked_ids(output_ids) if isinstance(output_ids, list) else None,
        output_length=meta.get("completion_tokens"),
        finish_reason=finish.get("type") if isinstance(finish, dict) else None,
        server_cached_tokens=count(meta.get("cached_tokens")),
        server_prompt_tokens=count(meta.get("prompt_tokens")),
    )


def _python_string(line: str, start: int) -> tuple[str | None, int]:
    """The Python string literal (or ``None``) at ``start``, and where it ends."""
    if line.startswith("None", start):
        return None, start + 4
    quote = line[start : start + 1]
    if quote not in ("'", '"'):
        raise BadLine("prompt is not a quoted string")
    position = start + 1
    while position < len(line):
        char = line[position]
        if char == "\\":
            position += 2
            continue
        if char == quote:
            return _literal(line[start : position + 1], "prompt"), position + 1
        position += 1
    raise BadLine("the prompt's string never ends (line cut short?)")


def _int_list(text: str, name: str) -> list[int] | None:
    """A ``[1, 2, 3]`` or ``None`` at the start of ``text``."""
    if text.startswith("None"):
        return None
    end = text.find("]")
    if not text.startswith("[") or end < 0:
        raise BadLine(f"{name} is not a list of integers")
    try:
        values = json.loads(text[: end + 1])
    except ValueError:
        raise BadLine(f"{name} is not a list of integers") from None
    return _checked_ids(values)


def _checked_ids(values: Any) -> list[int]:
    if not isinstance(values, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31 for v in values
    ):
        raise BadLine("token ids must be a list of non-negative integers")
    return values


def _strip_headers(text: str) -> str:
    """The ``GenerateReqInput(...)`` repr, without a trailing ``, headers={...}``."""
    at = text.rfind(", headers={")
    return text[:at] if at >= 0 and text.rstrip().endswith("}") else text


def _dataclass_fields(text: str) -> dict[str, Any]:
    """The literal fields of a dataclass repr ``Name(a=1, b='x', ...)``; other values are None."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError):
        raise BadLine(
            TRUNCATED if "' ... '" in text or "] ... [" in text else "unparseable repr"
        ) from None
    call = tree.body
    if not isinstance(call, ast.Call):
        raise BadLine("expected GenerateReqInput(...)")
    fields: dict[str, Any] = {}
    for keyword in call.keywords:
        try:
            fields[keyword.arg or ""] = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            fields[keyword.arg or ""] = None
    return fields


def _literal(text: str, name: str) -> Any:
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, TypeError, SyntaxError, RecursionError):
        raise BadLine(
            TRUNCATED if "' ... '" in text else f"{name} is not a Python literal"
        ) from None


def _optional_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _vllm_time(prefix: str) -> float | None:
    match = VLLM_TIME.search(prefix)
    if match is None:
        return None
    month, day, hour, minute, second = (int(g) for g in match.groups()[:5])
    fraction = float(f"0.{match.group(6)}") if match.group(6) else 0.0
    try:
        when = datetime(2000, month, day, hour, minute, second, tzinfo=UTC)
    except ValueError:
        return None
    return when.timestamp() + fraction


def _sglang_time(line: str) -> float | None:
    match = SGLANG_TIME.match(line)
    if match is None:
        return None
    return datetime.fromisoformat(match.group(1)).replace(tzinfo=UTC).timestamp()
