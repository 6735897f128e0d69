"""The one generation request: what to generate and how, with nothing of the surface that
carried it (`slm run`'s options, a Session's call or an HTTP body: slm.server.protocol maps
JSON to one). slm.api exports these types."""

from __future__ import annotations

import json
import re
from dataclasses import InitVar, dataclass

from slm.errors import InvalidInput

MAX_SCHEMA_BYTES = 256 << 10  # a schema's JSON text: far above any real one
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for a function's name
# the keys OpenAI defines in each object these parsers read; any other is refused (a typo, or a
# feature slm does not have, must not pass unnoticed)
TOOL_KEYS = frozenset({"type", "function"})
FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})
RESPONSE_FORMAT_KEYS = frozenset({"type", "json_schema"})
JSON_SCHEMA_KEYS = frozenset({"name", "description", "schema", "strict"})


def check_keys(obj: dict, allowed: frozenset, where: str) -> None:
    """InvalidInput naming the first key of obj that is not allowed (a null one is absent)."""
    for key, value in obj.items():
        if key not in allowed and value is not None:
            raise InvalidInput(f"unknown field: {where}.{key}")


@dataclass(frozen=True)
class ToolCall:
    """A call an assistant made (in a conversation sent back) or makes (parsed from an answer)."""

    id: str
    name: str
    arguments: str  # JSON text, as OpenAI carries it


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system", "user", "assistant" or "tool"
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    name: str | None = None

    def to_template(self) -> dict:
        """The message as chat templates read it (None fields left out by the renderer)."""
        out: dict = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


@dataclass(frozen=True)
class Tools:
    """A request's functions and how it may use them (OpenAI's tools, tool_choice and
    parallel_tool_calls), checked for shape; the base's template decides the rest."""

    definitions_json: str  # [{"type": "function", "function": {"name", "description", "parameters"}}]
    choice: str = "auto"  # "none", "auto", "required" or "function" (the one named)
    name: str | None = None  # choice "function": the function it must call
    parallel: bool = True

    @property
    def definitions(self) -> list[dict]:
        return json.loads(self.definitions_json)

    @property
    def parsed(self) -> bool:
        """Whether calls are read out of the answer (not with tool_choice "none")."""
        return self.choice != "none"

    @property
    def forced(self) -> bool:
        """Whether the answer must be calls (required or a named function): a grammar says so."""
        return self.choice in ("required", "function")

    @classmethod
    def of(cls, tools, choice=None, parallel=None) -> "Tools | None":
        if tools is None:
            if choice not in (None, "none", "auto"):
                raise InvalidInput("tool_choice needs tools")
            return None
        if not isinstance(tools, list) or not tools:
            raise InvalidInput("tools must be a non-empty list of {type: function, function: {...}}")
        names = []
        for i, t in enumerate(tools):
            f = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
            if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
                raise InvalidInput(f"tools[{i}] must be {{type: function, function: {{name, parameters}}}}")
            check_keys(t, TOOL_KEYS, f"tools[{i}]")
            check_keys(f, FUNCTION_KEYS, f"tools[{i}].function")
            if not TOOL_NAME.fullmatch(f["name"]):
                raise InvalidInput(f"tools[{i}].function.name must be 1 to 64 letters, digits, _ or -")
            if f.get("parameters") is not None and not isinstance(f["parameters"], dict):
                raise InvalidInput(f"tools[{i}].function.parameters must be a JSON schema object")
            names.append(f["name"])
        if len(set(names)) != len(names):
            raise InvalidInput("tools: two functions have the same name")
        name = None
        if choice is None:
            choice = "auto"
        elif isinstance(choice, dict):
            f = choice.get("function") if choice.get("type") == "function" else None
            name = f.get("name") if isinstance(f, dict) else None
            if name not in names:
                raise InvalidInput("tool_choice must name one of the tools: {type: function, function: {name}}")
            check_keys(choice, TOOL_KEYS, "tool_choice")
            check_keys(f, frozenset({"name"}), "tool_choice.function")
            choice = "function"
        elif choice not in ("none", "auto", "required"):
            raise InvalidInput("tool_choice must be none, auto, required or {type: function, function: {name}}")
        if parallel is not None and not isinstance(parallel, bool):
            raise InvalidInput("parallel_tool_calls must be true or false")
        return cls(json_text(tools, "tools"), choice, name, True if parallel is None else parallel)

    @classmethod
    def from_file(cls, path, choice: str | None = None) -> "Tools":
        """`slm run --tools FILE [--tool-choice none|auto|required|NAME]`: OpenAI's tools list
        read from a file; a choice that is none of the three words names the function to call."""
        tools = read_json_file(path, "--tools")
        if choice not in (None, "none", "auto", "required"):
            choice = {"type": "function", "function": {"name": choice}}
        return cls.of(tools, choice)


def json_text(value, what: str) -> str:
    """`value` as JSON text of at most MAX_SCHEMA_BYTES; InvalidInput for what JSON text cannot
    carry (a non-finite number, a value of another type, a lone surrogate, nesting past the
    interpreter's depth) or a text over the limit."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        size = len(text.encode())
    except (TypeError, ValueError, RecursionError) as err:  # (UnicodeEncodeError is a ValueError)
        raise InvalidInput(f"{what} is not JSON text ({type(err).__name__})") from err
    if size > MAX_SCHEMA_BYTES:
        raise InvalidInput(f"{what} is over {MAX_SCHEMA_BYTES >> 10} KiB")
    return text


def read_json_file(path, option: str):
    """The JSON document in a file a command-line option names, or a pipe such as <(...), read by
    the bounded reader within MAX_SCHEMA_BYTES (InvalidInput naming the option if it is not JSON;
    the reader's own errors for what cannot be read)."""
    from slm.formats import untrusted

    data = untrusted.read_untrusted(path, MAX_SCHEMA_BYTES, option, pipe_wait=untrusted.PIPE_WAIT_S)
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise InvalidInput(f"{option} {path} is not JSON ({type(err).__name__})") from err


@dataclass(frozen=True)
class ResponseFormat:
    """What the answer must be: any JSON object ("json_object") or a document valid under a
    JSON schema ("json_schema"); enforced by grammar-constrained decoding (slm.engine.structured).
    The same for the server's response_format, Session.generate(response_format=...) and
    `slm run --json-schema FILE`."""

    kind: str  # "json_object" or "json_schema"
    # the schema as JSON text; "{"type": "object"}" for json_object, whose grammar is that
    # schema's with every structure bounded (slm.engine.json_object)
    schema_json: str
    name: str | None = None

    @property
    def schema(self) -> dict:
        return json.loads(self.schema_json)

    @classmethod
    def of(cls, value) -> "ResponseFormat | None":
        """OpenAI's response_format object ({"type": "text" | "json_object" | "json_schema",
        "json_schema": {"name", "schema", "strict"}}), checked; None for text (no constraint).
        A ResponseFormat passes through."""
        if value is None or isinstance(value, ResponseFormat):
            return value
        if not isinstance(value, dict):
            raise InvalidInput("response_format must be an object with a type")
        kind = value.get("type")
        check_keys(value, RESPONSE_FORMAT_KEYS, "response_format")
        if kind == "text":
            return None
        if kind == "json_object":
            return cls("json_object", json.dumps({"type": "object"}))
        if kind != "json_schema":
            raise InvalidInput("response_format.type must be text, json_object or json_schema")
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise InvalidInput("response_format.json_schema must be an object with name and schema")
        check_keys(spec, JSON_SCHEMA_KEYS, "response_format.json_schema")
        name, schema, strict = spec.get("name"), spec.get("schema"), spec.get("strict")
        if name is not None and not isinstance(name, str):
            raise InvalidInput("response_format.json_schema.name must be a string")
        if strict is not None and not isinstance(strict, bool):
            raise InvalidInput("response_format.json_schema.strict must be true or false")
        return cls.from_schema(schema, name, "response_format.json_schema.schema")

    @classmethod
    def from_file(cls, path) -> "ResponseFormat":
        """`slm run --json-schema FILE`: a JSON schema read from a file, or a pipe such as <(...)
        (the bounded reader's; InvalidInput if it is not a JSON object)."""
        from pathlib import Path

        schema = read_json_file(path, "--json-schema")
        return cls.from_schema(schema, Path(path).stem, f"--json-schema {path}")

    @classmethod
    def from_schema(cls, schema, name: str | None = None, what: str = "the JSON schema") -> "ResponseFormat":
        if not isinstance(schema, dict):
            raise InvalidInput(f"{what} must be a JSON object")
        return cls("json_schema", json_text(schema, what), name)


DEFAULT_MAX_TOKENS = 128  # a request that gives none: this many, or what the context leaves
ROLES = ("system", "user", "assistant", "tool")


def _check_text(text, what: str, may_be_empty: bool = False) -> None:
    if not isinstance(text, str):
        raise InvalidInput(f"{what} must be text (str), not {type(text).__name__}")
    if not text and not may_be_empty:
        raise InvalidInput(f"{what} is empty")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:  # undecodable argv bytes arrive as lone surrogates
        raise InvalidInput(f"{what} is not UTF-8 text") from err


def _message(m, i: int) -> ChatMessage:
    """A conversation's message i as a ChatMessage (a {"role", "content"} dict converted),
    checked: a known role; UTF-8 text content, possibly empty, as OpenAI's API takes it (none
    only for an assistant turn that called tools); a tool message names the call it answers."""
    if isinstance(m, dict):
        m = ChatMessage(m.get("role"), m.get("content"), name=m.get("name"), tool_call_id=m.get("tool_call_id"))
    if not isinstance(m, ChatMessage) or m.role not in ROLES:
        raise InvalidInput(f"message {i}: a message is {{role: {'|'.join(ROLES)}, content: text}}")
    if m.content is None and not (m.role == "assistant" and m.tool_calls):
        raise InvalidInput(f"message {i}: a message is {{role: {'|'.join(ROLES)}, content: text}}")
    if m.content is not None:
        _check_text(m.content, f"message {i}'s content", may_be_empty=True)
    if m.role == "tool" and not isinstance(m.tool_call_id, str):
        raise InvalidInput(f"message {i}: a tool message needs tool_call_id (the call it answers)")
    return m


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


MAX_STOP_TOKEN_IDS = 256


def _token_ids(ids, what: str) -> tuple[int, ...]:
    """A list of token ids (integers >= 0; at most MAX_STOP_TOKEN_IDS) as a sorted tuple without
    repeats; the vocabulary's bound is checked with the model (slm.engine.prepare)."""
    if not isinstance(ids, (list, tuple)) or not all(_whole(t) and t >= 0 for t in ids):
        raise InvalidInput(f"{what} must be a list of token ids (integers >= 0)")
    if len(ids) > MAX_STOP_TOKEN_IDS:
        raise InvalidInput(f"{what} takes at most {MAX_STOP_TOKEN_IDS} ids, not {len(ids)}")
    return tuple(sorted(set(ids)))


@dataclass(frozen=True)
class GenerationRequest:
    """What to generate and how: a prompt (or a chat) and every generation option, for `slm
    run`, the Python API and the server alike; checked once, here, for everything that needs
    no model (InvalidInput naming the option). What needs the model (the prompt's length
    against the context, the memory budget, a schema's grammar and logit_bias's ids against
    the vocabulary) slm.engine.prepare.prepare checks.

    Given as plain values, the options are normalised: `messages` may hold {"role", "content"}
    dicts, `stop` any sequence, `logit_bias` a {token id: bias} mapping, `response_format`
    OpenAI's object; a `system` message goes before the prompt (or the messages) and makes the
    request a chat."""

    prompt: str = ""  # not chat: the prompt text; chat without messages: the user's turn
    chat: bool = False
    messages: tuple[ChatMessage, ...] | None = None  # a conversation instead of the prompt (None: not a chat)
    system: InitVar[str | None] = None
    max_tokens: int | None = None  # None: DEFAULT_MAX_TOKENS, lowered to what the context leaves
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None  # None: each choice a fresh random seed; s: choice i uses s + i
    stop: tuple[str, ...] = ()  # stop sequences: the text ends before the first one (a str: one)
    n: int = 1  # choices, decoded as rows of one batch
    top_k: int = 0
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs, sorted
    logprobs: int | None = None  # None: none; k: each token's logprob and its k most likely alternatives
    response_format: ResponseFormat | None = None  # None: free text
    tools: Tools | None = None  # chat: functions the model may call (docs/serve.md, "Tools")
    # vLLM's options, with vLLM's meaning (docs/serve.md, "Request fields"; slm.engine.stops)
    min_tokens: int = 0  # no stop before this many tokens (stop tokens banned until then)
    ignore_eos: bool = False  # an end-of-generation token does not end the answer
    stop_token_ids: tuple[int, ...] = ()  # tokens that end the answer ("stop"), sorted
    include_stop_str_in_output: bool = False  # the stop sequence (or stop token's text) stays in the text
    skip_special_tokens: bool = True  # False: special tokens' texts are in the answer
    repetition_penalty: float = 1.0  # repeat_penalty's rule over the prompt's tokens too
    add_generation_prompt: bool = True  # chat: the template's opening of the assistant's turn
    continue_final_message: bool = False  # chat: the answer continues the last message's text

    def __post_init__(self, system: str | None) -> None:
        from slm.engine.sampling import check_processing, check_sampling, logit_bias_items, stop_sequences

        if system is not None:
            _check_text(system, "the system message")
        if self.messages is not None:
            if not isinstance(self.messages, (tuple, list)):
                raise InvalidInput("the conversation must be a list of messages")
            messages = tuple(_message(m, i) for i, m in enumerate(self.messages))
            chat = True
        else:
            _check_text(self.prompt, "the prompt")
            chat = self.chat or system is not None
            messages = (ChatMessage("user", self.prompt),) if chat else None
        if system is not None:
            messages = (ChatMessage("system", system), *messages)
        if chat and not messages:
            raise InvalidInput("the conversation has no messages")
        if self.tools is not None and not chat:
            raise InvalidInput("tools need a chat (messages)")
        if self.max_tokens is not None and not (_whole(self.max_tokens) and self.max_tokens >= 0):
            raise InvalidInput(f"max_tokens must be an integer >= 0, not {self.max_tokens!r}")
        check_sampling(self.temperature, self.top_p, self.seed)
        bias = dict(self.logit_bias) if isinstance(self.logit_bias, (tuple, list)) else self.logit_bias
        stop = stop_sequences(self.stop)  # (a string is one sequence, None none: as the server reads it)
        check_processing(self.top_k, self.min_p, self.frequency_penalty, self.presence_penalty,
                         self.repeat_penalty, bias, self.logprobs, self.n, stop=stop,
                         repetition_penalty=self.repetition_penalty)
        for name, value in (("chat", chat), ("messages", messages), ("stop", stop),
                            ("logit_bias", logit_bias_items(bias)),
                            ("response_format", ResponseFormat.of(self.response_format)),
                            ("stop_token_ids", _token_ids(self.stop_token_ids, "stop_token_ids"))):
            object.__setattr__(self, name, value)
        if not isinstance(self.tools, (Tools, type(None))):
            raise InvalidInput("tools must be given as a Tools (Tools.of checks OpenAI's form)")
        self._check_vllm_options()

    def _check_vllm_options(self) -> None:
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens", "add_generation_prompt",
                     "continue_final_message"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidInput(f"{name} must be true or false, not {getattr(self, name)!r}")
        if not (_whole(self.min_tokens) and self.min_tokens >= 0):
            raise InvalidInput(f"min_tokens must be an integer >= 0, not {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidInput(f"min_tokens ({self.min_tokens}) must be at most max_tokens ({self.max_tokens})")
        grammar = self.response_format is not None or (self.tools is not None and self.tools.forced)
        for name in ("ignore_eos", "min_tokens"):
            if getattr(self, name) and grammar:
                raise InvalidInput(f"{name} cannot go with response_format or forced tool calls: their grammar "
                                   "ends the answer with an end-of-generation token where the document is complete")
        if not self.chat and (self.continue_final_message or not self.add_generation_prompt):
            raise InvalidInput("add_generation_prompt and continue_final_message are for a chat (messages)")
        if self.continue_final_message:
            if self.add_generation_prompt:
                raise InvalidInput("continue_final_message needs add_generation_prompt false: the answer continues "
                                   "the last message instead of opening a new one")
            if not self.messages[-1].content:
                raise InvalidInput("continue_final_message needs a last message with text to continue")

    @property
    def conversation(self) -> list[dict] | None:
        """The messages as chat templates read them (None: the prompt is plain text)."""
        return [m.to_template() for m in self.messages] if self.chat else None
